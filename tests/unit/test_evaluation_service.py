"""One evaluation service observes a training loop: the start (evaluated, or read back from the
run folder), periodic evaluations on their schedule, the final one, and the summary fields."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from torch import nn

from rlfleet.config import load_config
from rlfleet.eval.paired import read_episodes
from rlfleet.eval.service import EvaluationService, PeriodicEval, keep_before
from rlfleet.eval.summary import read_summary, write_summary
from rlfleet.runs.launcher import starting_policy
from rlfleet.telemetry.trackers import MetricsLogger


class Recorded:
    """A tracker backend that keeps what it is sent."""

    def __init__(self) -> None:
        self.scalars_at: list[tuple[dict[str, float], int]] = []
        self.tables: list[str] = []

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.scalars_at.append((dict(values), step))

    def table(self, key, columns, rows, step) -> None:
        self.tables.append(key)

    def flush(self) -> None:
        pass


@dataclass
class Loop:
    """A training loop as the service sees it (`rlfleet.eval.service.TrainingLoop`)."""

    policy: nn.Module
    writer: MetricsLogger
    updates: int = 0
    shown: list[str] = field(default_factory=list)

    step_unit = "env steps"

    @property
    def step(self) -> int:
        return 100 * self.updates  # an x axis other than the update count

    def show(self, info: str) -> None:
        self.shown.append(info)


def _cfg(run: Path, *overrides: str):
    return load_config(
        "metaworld_reach_ppo",
        [
            f"runner.logger.log_path={run}",
            "env.max_episode_steps=10",
            "eval.episodes_per_task=2",
            "policy.hidden_sizes=[16]",
            *overrides,
        ],
    )


def test_the_service_observes_a_loop_from_start_to_summary(tmp_path):
    cfg = _cfg(tmp_path, "eval.before=true")
    backend = Recorded()
    loop = Loop(starting_policy(cfg), MetricsLogger({"rec": backend}))
    service = EvaluationService(cfg, tmp_path, PeriodicEval(1, every_updates=2, last_update=4), evaluate_start=True)
    service.on_start(loop)  # nothing trained yet: the start is evaluated and kept
    before = json.loads((tmp_path / "eval_before.json").read_text())
    assert set(before) == {"reach-v3"} and len(read_episodes(tmp_path / "episodes_before.jsonl")) == 2

    logged = {}
    for updates in (1, 2, 3, 4):
        loop.updates = updates
        logged[updates] = service.on_update(loop)
    assert not logged[1] and not logged[3] and not logged[4]  # every 2nd update, none at the last
    assert set(logged[2]) == {"eval/success_once", "eval/elapsed_s"}
    assert (logged[2], 200) in backend.scalars_at  # at the loop's own step
    assert len(read_episodes(tmp_path / "periodic_eval" / "update_000002")) == 1

    summary: dict = {"updates": 4}
    service.on_end(loop, summary, completed=True)
    assert summary["eval_before"] == before and summary["eval_before_mean"] == before["reach-v3"]
    assert set(summary["eval_success"]) == {"reach-v3"}
    assert summary["eval_success_mean"] == pytest.approx(summary["eval_success"]["reach-v3"])
    assert set(summary["eval_mean_return"]) == {"reach-v3"}
    assert summary["eval_split"] == "test"
    final = read_episodes(tmp_path / "episodes.jsonl")
    assert sum(r["success"] for r in final) / len(final) == summary["eval_success"]["reach-v3"]
    assert "eval/before_after" in backend.tables  # the trackers get the start beside the end
    assert "evaluating the trained policy ..." in loop.shown


def test_a_loop_whose_start_was_evaluated_elsewhere_reads_it_back(tmp_path):
    """The local launcher evaluates the start before the fleet; the learner's service reads it for
    its summary, and a run stopped early gets no final evaluation."""
    keep_before(tmp_path, {"reach-v3": 0.5})
    cfg = _cfg(tmp_path, "eval.before=true")
    loop = Loop(starting_policy(cfg), MetricsLogger({}))
    service = EvaluationService(cfg, tmp_path, PeriodicEval.from_config(cfg.eval))
    service.on_start(loop)
    loop.updates = 3
    assert service.on_update(loop) == {}  # the recipe asks for no periodic evaluation
    summary: dict = {}
    service.on_end(loop, summary, completed=False)
    assert summary == {"eval_before": {"reach-v3": 0.5}, "eval_before_mean": 0.5, "eval_split": "test"}
    assert not (tmp_path / "episodes.jsonl").exists()


def test_the_start_is_played_without_videos_on_the_runs_split_and_reused_only_on_it(tmp_path, monkeypatch):
    """`before` records no videos (they would land beside the final evaluation's) and keeps its
    split beside eval_before.json; a resumed run reuses the start only when it played the run's
    `eval.split`, and the summary names the split when only the start was evaluated."""
    import rlfleet.eval.service as service_module

    video_cfgs = []
    real = service_module.evaluate_policy

    def recording(*args, **kwargs):
        video_cfgs.append(kwargs["video_cfg"])
        return real(*args, **kwargs)

    monkeypatch.setattr(service_module, "evaluate_policy", recording)
    cfg = _cfg(tmp_path, "eval.before=true", "eval.video_cfg.save_video=true")
    service = EvaluationService(cfg, tmp_path)
    service.before(lambda: starting_policy(cfg))
    assert video_cfgs == [None]
    assert (tmp_path / "eval_before_split.txt").read_text().strip() == "test"
    summary: dict = {}
    service.on_end(Loop(starting_policy(cfg), MetricsLogger({})), summary, completed=False)
    assert summary["eval_split"] == "test" and "eval_success" not in summary

    resumed = _cfg(tmp_path, "eval.before=true", "runner.resume=true")
    EvaluationService(resumed, tmp_path).before(lambda: pytest.fail("the kept start is reused"))
    validation = _cfg(tmp_path, "eval.before=true", "runner.resume=true", "eval.split=validation")
    service = EvaluationService(validation, tmp_path)
    service.before(lambda: starting_policy(validation))  # the kept start played test: played again
    assert (tmp_path / "eval_before_split.txt").read_text().strip() == "validation"
    seeds = [r["seed"] for r in read_episodes(tmp_path / "episodes_before.jsonl")]
    assert seeds == [validation.eval.validation_seed, validation.eval.validation_seed + 1]


def test_every_evaluation_plays_the_runs_split(tmp_path):
    """eval.split=validation: the service's episodes start at the validation split's first seed,
    and the summary says which split the final evaluation played."""
    cfg = _cfg(tmp_path, "eval.split=validation")
    loop = Loop(starting_policy(cfg), MetricsLogger({}))
    service = EvaluationService(cfg, tmp_path)
    summary: dict = {}
    service.on_end(loop, summary, completed=True)
    assert summary["eval_split"] == "validation"
    seeds = [r["seed"] for r in read_episodes(tmp_path / "episodes.jsonl")]
    assert seeds == [cfg.eval.validation_seed, cfg.eval.validation_seed + 1]  # one task: seed + j
    assert not set(seeds) & set(range(cfg.eval.seed, cfg.eval.seed + 2))


def test_the_summary_is_written_and_read_whole(tmp_path):
    assert read_summary(tmp_path) is None
    write_summary(tmp_path / "run", {"updates": 3, "eval_success": {"reach-v3": 1.0}})
    assert read_summary(tmp_path / "run") == {"updates": 3, "eval_success": {"reach-v3": 1.0}}
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["summary.json"]  # no temporary left
