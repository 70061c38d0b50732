"""docs/results.md is built from the committed data in docs/results/ (bench/results_page.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest

from rlfleet.envs.metaworld import TASK_SETS
from rlfleet.envs.metaworld.difficulty import DIFFICULTY_GROUPS

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("results_page", ROOT / "bench" / "results_page.py")
results_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results_page)


def test_the_committed_page_is_the_one_its_data_builds():
    assert (ROOT / "docs" / "results.md").read_text() == results_page.build_page(ROOT / "docs" / "results")
    assert results_page.main(["--check"]) == 0


def test_the_data_folder_holds_json_and_png_only_for_what_the_page_reads():
    data = ROOT / "docs" / "results"
    for name in ("headline_5task.json", "published/rlinf_metaworld_mt50.json", "hf_oft_quickstart_cpu/section.json"):
        json.loads((data / name).read_text())
    rows = json.loads((data / "headline_5task.json").read_text())
    assert rows["selected_on"] == "test" and "transcribed" not in rows["source"]  # the page says "Transcribed from"
    page = results_page.build_page(data)
    assert "**Transcribed** from docs/results.md as written by hand at commit 8da3781" in page
    assert "**Selected on the test episodes.**" in page
    assert page.count("\n") <= 320


def _copy_data(tmp_path: Path) -> Path:
    data = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", data, ignore=shutil.ignore_patterns("*.png", "metaworld_m*"))
    return data


def _runs(tmp_path: Path, tasks: list[str], before: float, after: dict[str, float]) -> Path:
    """A bench/reproduce.py folder with 3 seeds: every task at `before`, after RL at `after` per
    group plus a seed-dependent 0.00 / 0.02 / 0.04."""
    runs = tmp_path / "runs"
    for seed in range(3):
        (runs / f"seed{seed}").mkdir(parents=True)
        group_of = {t: g for g, ts in DIFFICULTY_GROUPS.items() for t in ts}
        summary = {
            "eval_before": {t: before for t in tasks},
            "eval_success": {t: after[group_of[t]] + 0.02 * seed for t in tasks},
            "env_steps": 5_000_000 + seed,
            "train_seconds": 100.0,
        }
        (runs / f"seed{seed}" / "summary.json").write_text(json.dumps(summary))
        (runs / f"seed{seed}" / "model.safetensors").write_bytes(b"no checkpoints")
    meta = {"recipe": "toy_mt50", "commands": ["rlfleet train toy"], "commit": "abc", "episodes_per_task": 10}
    meta["sft_starts"] = [f"cache/sft-{seed}" for seed in range(3)]
    (runs / "results.json").write_text(json.dumps(meta | {"wall_seconds": [60.0, 61.0, 62.0], "plots": ["a.png"]}))
    (runs / "a.png").write_bytes(b"\x89PNG")
    return runs


AFTER = {"easy": 0.9, "medium": 0.6, "hard": 0.5, "very_hard": 0.2}


def test_an_mt50_result_shows_each_group_before_and_after_beside_rlinfs_rows(tmp_path):
    data = _copy_data(tmp_path)
    page = results_page.build_page(data)
    assert "**Not yet measured**: no 3-seed run's data in `docs/results/metaworld_mt50/`" in page
    assert "| pi0 + PPO (RLinf) | 92.1 | 74.6 | 61.7 | 84.0 | 78.1 |" in page  # shown while ours is not measured
    runs = _runs(tmp_path, TASK_SETS["MT50"], 0.5, AFTER)
    dest = results_page.add_result(runs, "metaworld_mt50", data, selected_on="validation")
    assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == ["a.png", "results.json"] + ["summary.json"] * 3
    page = results_page.build_page(data)
    section = page.split("## MetaWorld MT50")[1].split("\n## ")[0]
    assert "Not yet measured" not in section
    assert "3 seeds, each a full repeat (its own SFT start" in section and "selected on the validation split" in section
    assert "| SFT start (ours) | 50.0 +- 0.0 | 50.0 +- 0.0 | 50.0 +- 0.0 | 50.0 +- 0.0 | 50.0 +- 0.0 |" in section
    # seeds at +0, +2, +4 points: mean +2, standard error 2 / sqrt(3) = 1.15
    assert "| after RL (ours) | 92.0 +- 1.2 | 62.0 +- 1.2 | 52.0 +- 1.2 | 22.0 +- 1.2 | 57.0 +- 1.2 |" in section
    assert "| gain (points) | +42.0 +- 1.2 | +12.0 +- 1.2 | +2.0 +- 1.2 | -28.0 +- 1.2 | +7.0 +- 1.2 |" in section
    assert "| pi0 (SFT) (RLinf) | 77.9 | 51.8 | 53.3 | 20.0 | 50.8 |" in section
    se = 100 * math.sqrt(0.92 * 0.08 / 280)  # Easy: 28 tasks x 10 episodes at 92%
    assert f"Easy {se:.1f} (280 episodes)" in section and "Avg. " in section
    assert "Env steps per seed: 5,000,000, 5,000,001, 5,000,002; wall seconds per seed: 60, 61, 62" in section
    assert "![a.png](results/metaworld_mt50/a.png)" in section and "rlfleet train toy" in section
    assert "ML45" in page and "Not yet measured" in page.split("## MetaWorld ML45")[1]


def test_an_ml45_result_groups_its_45_training_tasks_and_reports_the_held_out_five_apart(tmp_path):
    data = _copy_data(tmp_path)
    tasks = TASK_SETS["ML45_train"] + TASK_SETS["ML45_test"]
    results_page.add_result(_runs(tmp_path, tasks, 0.5, AFTER), "metaworld_ml45", data)
    section = results_page.build_page(data).split("## MetaWorld ML45")[1]
    assert "Not yet measured" not in section and "RLinf)" not in section  # RLinf publishes no ML45 rows
    assert "**how it was selected is not recorded**" in section
    held_out = section.split("The 5 held-out tasks")[1].split("\n\n")[1]  # its table
    assert held_out.count("\n| ") == 5  # five task rows under the header
    assert "| hand-insert-v3 | Hard | 50.0 +- 0.0 | 52.0 +- 1.2 | +2.0 +- 1.2 |" in held_out
    # the groups count the training tasks only: 26 easy ones (door-lock and door-unlock are held out)
    assert "Easy " + f"{100 * math.sqrt(0.92 * 0.08 / 260):.1f} (260 episodes)" in section


def test_add_refuses_a_folder_without_a_result(tmp_path):
    with pytest.raises(FileNotFoundError, match="no bench/reproduce.py result"):
        results_page.add_result(tmp_path, "metaworld_mt50", tmp_path / "data")


def test_settings_tried_on_validation_are_listed_from_their_data_and_test_runs_refused(tmp_path):
    """The MT50 settings are chosen on validation episodes: each candidate's summary is copied in
    with the overrides it ran, and the page lists them with their validation gains; a run on the
    test split (or without a before evaluation) cannot be added as a candidate."""
    data = _copy_data(tmp_path)
    name = results_page.SCREENS["mt50"]
    (data / name).mkdir(exist_ok=True)
    screen = {
        "recipe": "toy_mt50", "seed": 0, "env_steps": 1000, "episodes_per_task": 10, "validation_seed": 500000,
        "note": "Tried before the run.", "chosen": "B", "candidates": [],
    }  # fmt: skip
    (data / name / "screen.json").write_text(json.dumps(screen))
    tasks = TASK_SETS["MT50"]
    for cand, after, split in (("A", 0.5, "validation"), ("B", 0.75, "validation"), ("T", 0.9, "test")):
        run = tmp_path / cand
        run.mkdir()
        summary = {
            "eval_split": split,
            "eval_before": dict.fromkeys(tasks, 0.5),
            "eval_success": dict.fromkeys(tasks, after),
        }
        (run / "summary.json").write_text(json.dumps(summary))
        args = ["--data", str(data), "--out", str(tmp_path / "page.md"), "--add-candidate", str(run), name, cand]
        if split == "test":
            with pytest.raises(ValueError, match="not a validation run"):
                results_page.main([*args, "--overrides", "x=1"])
        else:
            assert results_page.main([*args, "--overrides", f"algorithm.lr={after}"]) == 0
    page = (tmp_path / "page.md").read_text()
    assert "### How the MT50 settings were chosen: validation episodes" in page
    assert "| A | `algorithm.lr=0.5` | - | 50.0 -> 50.0 |" in page and page.count("| +0.0 |") == 1
    assert "| B (chosen) | `algorithm.lr=0.75` | - | 50.0 -> 75.0 |" in page and "| +25.0 |" in page
    assert "| T " not in page
    assert [c["name"] for c in json.loads((data / name / "screen.json").read_text())["candidates"]] == ["A", "B"]
