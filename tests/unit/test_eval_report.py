"""rlfleet.eval.report: the groups the env declares (MetaWorld: difficulty, ML45), Markdown/JSON, before/after."""

import json

import pytest
from rich.console import Console

from rlfleet.envs.metaworld import DIFFICULTY, TASK_SETS
from rlfleet.envs.registry import task_groups
from rlfleet.eval.report import (
    compare,
    compare_markdown,
    compare_rich,
    rich_table,
    success_table,
    to_markdown,
    write_report,
)

# easy: reach 1.0, door-open 0.5, door-lock 0.25 (held out) -> 1.75/3
# medium: basketball 0.8, bin-picking 0.2 (held out)       -> 0.5
# hard: push 0.0, hand-insert 0.6 (held out)                -> 0.3
# very_hard: none; ML45 held-out: 0.25, 0.2, 0.6 -> 0.35; all 7 tasks: 3.35/7
SUCCESS = {
    "reach-v3": 1.0,
    "door-open-v3": 0.5,
    "door-lock-v3": 0.25,
    "basketball-v3": 0.8,
    "bin-picking-v3": 0.2,
    "push-v3": 0.0,
    "hand-insert-v3": 0.6,
}


GROUPS = task_groups("metaworld")  # declared by MetaWorldEnv; the report itself knows no simulator
ML45_TEST_TASKS, ML45_TRAIN_TASKS = TASK_SETS["ML45_test"], TASK_SETS["ML45_train"]


def render(table) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def test_ml45_split_from_package() -> None:
    assert len(ML45_TEST_TASKS) == 5 and len(ML45_TRAIN_TASKS) == 45
    assert set(ML45_TEST_TASKS) <= set(TASK_SETS["MT50"])
    assert set(ML45_TEST_TASKS) | set(ML45_TRAIN_TASKS) == set(TASK_SETS["MT50"])
    assert not set(ML45_TEST_TASKS) & set(ML45_TRAIN_TASKS)
    assert "bin-picking-v3" in ML45_TEST_TASKS


def test_difficulty_grouping() -> None:
    assert DIFFICULTY["door-lock-v3"] == "easy" and DIFFICULTY["hand-insert-v3"] == "hard"
    assert list(GROUPS) == ["Easy", "Medium", "Hard", "Very Hard", "ML45 held-out"]
    t = success_table(SUCCESS, episodes={task: 10 for task in SUCCESS}, groups=GROUPS)
    g = t["groups"]
    assert g["Easy"]["success"] == pytest.approx(1.75 / 3) and g["Easy"]["tasks"] == 3
    assert g["Medium"]["success"] == pytest.approx(0.5) and g["Medium"]["tasks"] == 2
    assert g["Hard"]["success"] == pytest.approx(0.3) and g["Hard"]["tasks"] == 2
    assert g["Very Hard"] is None
    assert g["ML45 held-out"] == {"success": pytest.approx(0.35), "tasks": 3}
    assert t["mean"] == pytest.approx(3.35 / 7) and t["num_tasks"] == 7
    assert [r["task"] for r in t["tasks"]] == list(SUCCESS)
    row = t["tasks"][4]
    assert row == {"task": "bin-picking-v3", "group": "Medium", "success": 0.2, "episodes": 10}


def test_unknown_task_and_bad_values() -> None:
    t = success_table({"my-task": 0.5}, groups=GROUPS)
    assert t["tasks"][0]["group"] is None and t["tasks"][0]["episodes"] is None
    assert all(v is None for v in t["groups"].values()) and t["mean"] == 0.5
    assert success_table({"my-task": 0.5})["groups"] == {}  # an env that declares no groups
    assert success_table({})["mean"] is None
    with pytest.raises(ValueError):
        success_table({"reach-v3": 1.5})
    with pytest.raises(ValueError):
        success_table({"reach-v3": float("nan")})


def test_markdown() -> None:
    md = to_markdown(success_table(SUCCESS, {"reach-v3": 10}, GROUPS), "MT50 eval")
    assert md.startswith("# MT50 eval\n")
    assert "| Split | Easy | Medium | Hard | Very Hard | ML45 held-out | Avg. |" in md
    assert "| Success (%) | 58.3 | 50.0 | 30.0 | - | 35.0 | 47.9 |" in md
    assert "| Tasks | 3 | 2 | 2 | 0 | 3 | 7 |" in md
    assert "| Task | Group | Success (%) | Episodes |" in md
    assert "| reach-v3 | Easy | 100.0 | 10 |" in md
    assert "| hand-insert-v3 | Hard | 60.0 | - |" in md


def test_write_report(tmp_path) -> None:
    table = success_table(SUCCESS, groups=GROUPS)
    json_path, md_path = write_report(table, tmp_path / "run", name="eval_final")
    assert json_path == tmp_path / "run" / "eval_final.json" and md_path.name == "eval_final.md"
    assert json.loads(json_path.read_text()) == json.loads(json.dumps(table))
    assert "| Success (%) | 58.3 |" in md_path.read_text()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["eval_final.json", "eval_final.md"]


def test_rich_table() -> None:
    text = render(rich_table(success_table(SUCCESS, groups=GROUPS)))
    for needle in ("bin-picking-v3", "58.3", "ML45 held-out", "35.0", "Avg.", "47.9"):
        assert needle in text
    assert "Very Hard" not in text  # no very-hard task evaluated: no summary row for it


def test_compare() -> None:
    before = {"reach-v3": 0.5, "push-v3": 0.25, "door-open-v3": 1.0}
    after = {"reach-v3": 1.0, "push-v3": 0.0, "soccer-v3": 0.4}
    cmp = compare(before, after, GROUPS)
    assert [r["task"] for r in cmp["tasks"]] == ["reach-v3", "push-v3", "door-open-v3", "soccer-v3"]
    assert cmp["tasks"][0]["delta"] == pytest.approx(0.5) and cmp["tasks"][1]["delta"] == pytest.approx(-0.25)
    assert cmp["tasks"][2]["after"] is None and cmp["tasks"][2]["delta"] is None
    # means over the 2 tasks in both: before 0.375, after 0.5
    assert cmp["mean"] == {
        "before": pytest.approx(0.375),
        "after": pytest.approx(0.5),
        "delta": pytest.approx(0.125),
        "tasks": 2,
    }
    md = compare_markdown(before, after, "before / after", GROUPS)
    assert "| Task | Group | Before (%) | After (%) | Delta (pp) |" in md
    assert "| reach-v3 | Easy | 50.0 | 100.0 | +50.0 |" in md
    assert "| push-v3 | Hard | 25.0 | 0.0 | -25.0 |" in md
    assert "| door-open-v3 | Easy | 100.0 | - | - |" in md
    assert md.rstrip().endswith("| **Mean** (2 tasks) |  | 37.5 | 50.0 | +12.5 |")
    text = render(compare_rich(before, after))
    assert "+50.0" in text and "-25.0" in text and "+12.5" in text
