"""bench/reproduce.py's aggregation, curves and plots on synthetic runs."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

_spec = importlib.util.spec_from_file_location(
    "reproduce", Path(__file__).resolve().parents[2] / "bench" / "reproduce.py"
)
reproduce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reproduce)


def _summary(before: dict, after: dict, steps: int = 1000, seconds: float = 60.0) -> dict:
    return {"eval_before": before, "eval_success": after, "env_steps": steps, "train_seconds": seconds}


SUMMARIES = [
    _summary({"a": 0.2, "b": 0.4}, {"a": 0.6, "b": 0.8}),
    _summary({"a": 0.2, "b": 0.4}, {"a": 0.8, "b": 0.8}),
    _summary({"a": 0.2, "b": 0.4}, {"a": 1.0, "b": 0.5}),
]


def test_mean_and_standard_error_over_seeds():
    agg = reproduce.aggregate(SUMMARIES)
    mean, se = agg["tasks"]["a"]["after"]
    assert mean == pytest.approx(0.8) and se == pytest.approx(0.2 / math.sqrt(3))  # std(0.6, 0.8, 1.0) = 0.2
    assert agg["tasks"]["a"]["before"] == pytest.approx((0.2, 0.0))
    # the mean row: each seed's task mean (0.7, 0.8, 0.75), then mean +- SE over seeds
    mean, se = agg["mean"]["after"]
    assert mean == pytest.approx(0.75) and se == pytest.approx(0.05 / math.sqrt(3))
    assert agg["mean"]["gain"][0] == pytest.approx(0.45)
    assert reproduce.mean_se([0.5]) == (0.5, 0.0)


def test_results_page_has_table_commands_commit_and_plots():
    agg = reproduce.aggregate(SUMMARIES)
    page = reproduce.results_markdown(
        "toy",
        agg,
        ["rlfleet train toy runner.seed=0"],
        "abc123",
        [60.0, 60.0, 96.0],
        {"success vs env steps": "toy_steps.png"},
        "10 episodes per task",
    )
    assert "| a | 20.0 +- 0.0 | 80.0 +- 11.5 | +60.0 +- 11.5 |" in page
    assert "| **mean** | 30.0 +- 0.0 | 75.0 +- 2.9 | +45.0 +- 2.9 |" in page
    assert (
        "rlfleet train toy runner.seed=0" in page
        and "`abc123`" in page
        and "![success vs env steps](toy_steps.png)" in page
    )
    assert "total 3.6 min" in page
    assert "above" not in page  # no episode count given: no sampling line


def test_results_page_says_what_a_100_percent_task_on_n_episodes_is_known_to_be():
    """k = n successes: the exact one-sided 95% bound solves p ** n = 0.05 (0.942 for n = 50), the
    rate a binomial test against the same k = n would reject at the 5% level just below it."""
    p = reproduce.all_success_bound(50)
    assert p**50 == pytest.approx(0.05) and (p - 0.001) ** 50 < 0.05 < (p + 0.001) ** 50
    agg = reproduce.aggregate(SUMMARIES)
    page = reproduce.results_markdown("toy", agg, ["x"], "abc", [1.0] * 3, {}, "50 episodes", episodes_per_task=50)
    assert "a task at 100% on 50 episodes is, at 95% confidence, only known to be above 94.2%." in page


def test_curves_from_tensorboard_to_png(tmp_path):
    curves = []
    for seed, (summary, rate) in enumerate(zip(SUMMARIES, (0.3, 0.5, 0.4))):
        tb = tmp_path / f"seed{seed}"
        w = SummaryWriter(str(tb))
        for k, step in enumerate((250, 500, 750)):
            w.add_scalar("eval/success_once", min(1.0, 0.3 + rate * k / 2), step)
            w.add_scalar("eval/elapsed_s", 15.0 * (k + 1), step)
        w.close()
        raw = reproduce.read_curves(tb)
        assert list(raw["steps"]) == [250, 500, 750] and list(raw["seconds"]) == [15, 30, 45]
        curves.append(reproduce.run_curve(summary, raw))
    # the starting policy at 0 and the final evaluation at the run's end frame the periodic points
    assert list(curves[0]["steps"]) == [0, 250, 500, 750, 1000]
    assert curves[0]["success"][0] == pytest.approx(0.3) and curves[0]["success"][-1] == pytest.approx(0.7)
    grid, mean, se = reproduce.mean_curve(curves, "steps", points=5)
    assert list(grid) == [0, 250, 500, 750, 1000]
    assert mean[2] == pytest.approx(np.mean([0.3 + r / 2 for r in (0.3, 0.5, 0.4)]))
    assert se[0] == 0.0 and se[2] > 0
    for x in ("steps", "seconds"):
        png = reproduce.plot_curves(curves, x, tmp_path / f"toy_{x}.png", "toy")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_a_resumed_runs_wall_clock_runs_on_across_its_lives(tmp_path):
    """Each learner life logs eval/elapsed_s from 0: the curve continues from the last life's end."""
    tb = tmp_path / "tb"
    # two writers: two lives; the first life's last evaluation has no elapsed_s (an older log)
    for life, points in enumerate((((250, 15.0), (500, 30.0), (600, None)), ((750, 10.0), (1000, 25.0)))):
        w = SummaryWriter(str(tb))
        for step, elapsed in points:
            w.add_scalar("eval/success_once", 0.5, step)
            if elapsed is not None:
                w.add_scalar("eval/elapsed_s", elapsed, step)
        w.close()
        # Lives are read in file-name order: real lives start seconds apart (the name begins with the
        # start time), but two writers of one second in one process differ only in a counter whose
        # "10" sorts before "9". Name this life's file as a later start would.
        (new,) = [f for f in tb.iterdir() if ".life" not in f.name]
        new.rename(tb / f"events.out.tfevents.{1_700_000_000 + life:010d}.life{life}")
    raw = reproduce.read_curves(tb)
    assert list(raw["steps"]) == [250, 500, 600, 750, 1000]
    np.testing.assert_array_equal(raw["seconds"], [15, 30, np.nan, 40, 55])
    # the end point: this life's train_seconds after the earlier lives' (an older summary) ...
    assert reproduce.run_curve(dict(SUMMARIES[0], train_seconds=28.0), raw)["seconds"][-1] == 58.0
    # ... or the learner's own total, where the summary has it
    total = dict(SUMMARIES[0], train_seconds=28.0, train_seconds_all_lives=60.0)
    assert reproduce.run_curve(total, raw)["seconds"][-1] == 60.0


def test_a_run_without_periodic_eval_still_has_its_end_points(tmp_path):
    raw = reproduce.read_curves(tmp_path)  # no event files
    curve = reproduce.run_curve(SUMMARIES[0], raw)
    assert list(curve["steps"]) == [0, 1000] and list(curve["success"]) == pytest.approx([0.3, 0.7])


def test_policy_strip_lays_out_rows_of_evenly_spaced_frames():
    spec = importlib.util.spec_from_file_location("policy_strip", Path(reproduce.__file__).parent / "policy_strip.py")
    strip_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(strip_mod)
    video = [np.full((64, 64, 3), k, np.uint8) for k in range(11)]  # frame k is grey level k
    img = strip_mod.strip([("before", video), ("after", video)], frames=3, side=32)
    assert img.size == (150 + 3 * 36, 2 * 36)
    tiles = [img.getpixel((150 + c * 36 + 16, 16)) for c in range(3)]
    assert tiles == [(0, 0, 0), (5, 5, 5), (10, 10, 10)]  # first, middle and last frame


def _chain_summary(before: float, after: float, len1: tuple[float, float]) -> dict:
    """A CALVIN-style run: no whole chain solved (success_once 0), subtasks done per chain."""

    def chain(avg: float, l1: float) -> dict:
        return {"all": {"avg_num_subtasks": avg, "success_len_1": l1, "success_len_2": 0.0}}

    summary = _summary({"calvin-D": 0.0}, {"calvin-D": 0.0}, steps=2000, seconds=100.0)
    summary["eval_chain_before"], summary["eval_chain"] = chain(before, len1[0]), chain(after, len1[1])
    return summary


CHAINS = [_chain_summary(0.08, 0.02, (0.08, 0.02)), _chain_summary(0.08, 0.20, (0.08, 0.16))]


def test_chained_runs_report_their_chain_metrics_and_plot_subtasks(tmp_path):
    agg = reproduce.aggregate(CHAINS)
    assert agg["chain"]["avg_num_subtasks"]["after"] == pytest.approx((0.11, 0.09))  # (0.02, 0.20): se = std / sqrt 2
    assert agg["chain"]["success_len_1"]["gain"][0] == pytest.approx(0.01)
    page = reproduce.results_markdown("calvin", agg, ["rlfleet train calvin"], "abc", [1.0, 1.0], {}, "50 chains")
    assert "| avg_num_subtasks | 0.08 +- 0.00 | 0.11 +- 0.09 | +0.03 +- 0.09 |" in page
    assert "| success_len_1 (%) | 8.0 +- 0.0 | 9.0 +- 7.0 | +1.0 +- 7.0 |" in page
    assert page.index("Chain metrics on held-out eval chains") < page.index("| chain metric |")
    assert "| task |" not in page  # whole-chain success (0% here) is success_len_5, in the chain table
    assert reproduce.curve_metric(CHAINS[0]) == "avg_num_subtasks"
    assert reproduce.curve_metric(SUMMARIES[0]) == "success_once"
    curves = []
    for seed, summary in enumerate(CHAINS):
        tb = tmp_path / f"seed{seed}"
        w = SummaryWriter(str(tb))
        w.add_scalar("eval/success_once", 0.0, 1000)  # whole chains: not what the curve shows
        w.add_scalar("eval/avg_num_subtasks", 0.3 + 0.1 * seed, 1000)
        w.add_scalar("eval/elapsed_s", 50.0, 1000)
        w.close()
        raw = reproduce.read_curves(tb, reproduce.curve_metric(summary))
        curves.append(reproduce.run_curve(summary, raw))
    assert list(curves[1]["success"]) == pytest.approx([0.08, 0.4, 0.20])  # before, periodic, final
    png = reproduce.plot_curves(curves, "steps", tmp_path / "calvin_steps.png", "calvin", "avg_num_subtasks")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rerun_keeps_the_seeds_that_finished(tmp_path, capsys, monkeypatch):
    """Run again after a cut: seeds with a summary.json are not trained again; the page names
    each seed's commit. Here every seed finished, so no training process starts."""
    import json

    for seed, summary in enumerate(SUMMARIES[:2]):
        (tmp_path / f"seed{seed}").mkdir()
        (tmp_path / f"seed{seed}" / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "wall_seconds.json").write_text(json.dumps({"0": 60.0, "1": 70.0, "commits": {"0": "aaa", "1": "bbb"}}))
    monkeypatch.setattr(reproduce.subprocess, "run", lambda *a, **k: pytest.fail("a finished seed was rerun"))
    assert reproduce.main(["metaworld_reach_ppo", "--seeds", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "seed 0: finished before" in out and "seed 1: finished before" in out
    page = (tmp_path / "results.md").read_text()
    assert "Commit: `seed 0: aaa, seed 1: bbb`." in page and "total 2.2 min" in page
    assert reproduce.seed_commits({"commit": "old"}, 2) == "old"  # a page written before per-seed commits


def test_which_seeds_a_rerun_keeps_resumes_or_starts_afresh(tmp_path):
    import json

    def seed(name: str, steps: int | None, checkpoint: bool) -> Path:
        d = tmp_path / name
        (d / "checkpoints").mkdir(parents=True)
        if steps is not None:
            (d / "summary.json").write_text(json.dumps({"env_steps": steps}))
        if checkpoint:
            (d / "checkpoints" / "latest").write_text("update_000010")
        return d

    assert reproduce.seed_state(seed("done", 2000, True), 2000, False) == ("done", 2000)
    assert reproduce.seed_state(seed("short", 1000, True), 2000, False) == ("resume", 1000)  # a larger budget
    assert reproduce.seed_state(seed("cut", None, True), 2000, False) == ("resume", None)  # cut mid-run
    assert reproduce.seed_state(seed("new", None, False), 2000, False) == ("fresh", None)
    # a wall-clock budget ends a run early by design: its summary means done
    assert reproduce.seed_state(tmp_path / "short", 2000, True) == ("done", 1000)
    # a resume starts from its checkpoint, which can lie behind the last summary
    (tmp_path / "short" / "checkpoints" / "update_000010").mkdir()
    state = {"counters": {"update": 10, "env_steps": 900}}
    (tmp_path / "short" / "checkpoints" / "update_000010" / "trainer_state.json").write_text(json.dumps(state))
    assert reproduce.seed_state(tmp_path / "short", 2000, False) == ("resume", 900)


def test_a_larger_budget_resumes_finished_seeds_and_the_page_says_so(tmp_path, capsys, monkeypatch):
    import json

    (tmp_path / "seed0" / "checkpoints").mkdir(parents=True)
    (tmp_path / "seed0" / "summary.json").write_text(json.dumps(_summary({"a": 0.2}, {"a": 0.4}, steps=1000)))
    (tmp_path / "seed0" / "checkpoints" / "latest").write_text("update_000010")
    (tmp_path / "wall_seconds.json").write_text(json.dumps({"0": 60.0, "commits": {"0": "aaa"}}))
    runs = []

    def fake_run(cmd, **kwargs):  # the resumed life: the learner rewrites summary.json at the new budget
        runs.append(cmd)
        (tmp_path / "seed0" / "summary.json").write_text(json.dumps(_summary({"a": 0.2}, {"a": 0.7}, steps=2000)))
        return reproduce.subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(reproduce.subprocess, "run", fake_run)
    monkeypatch.setattr(reproduce, "git_commit", lambda: "bbb")
    budget = ["runner.total_env_steps=2000", "runner.max_wall_seconds=0", "learner.batch_samples=64"]
    budget.append("actor.num_envs=8")  # one actor's segments within the lag bound (flow control)
    assert reproduce.main(["metaworld_reach_ppo", "--seeds", "1", "--out", str(tmp_path), *budget]) == 0
    assert len(runs) == 1 and runs[0][-1] == "--resume" and "runner.total_env_steps=2000" in runs[0]
    page = (tmp_path / "results.md").read_text()
    assert "| a | 20.0 +- 0.0 | 70.0 +- 0.0 | +50.0 +- 0.0 |" in page
    assert "Commit: `aaa`. Resumed (`--resume`, same folder): seed 0 from 1,000 env steps (commit bbb)." in page
    recorded = json.loads((tmp_path / "wall_seconds.json").read_text())
    assert recorded["0"] > 60.0  # the lives' wall times add up
    commands = page.split("```")[1]
    assert "--resume" not in commands  # the page's command is the one that reproduces the result from scratch
    # the budget reached: a third run keeps the seed
    monkeypatch.setattr(reproduce.subprocess, "run", lambda *a, **k: pytest.fail("a finished seed was rerun"))
    assert reproduce.main(["metaworld_reach_ppo", "--seeds", "1", "--out", str(tmp_path), *budget]) == 0


def test_a_life_killed_mid_run_keeps_its_resume_record_and_wall_time(tmp_path, monkeypatch):
    """A kill (a session stop) ends the command before it can record the life: the record is
    written before the life starts, and the next run counts the killed life's wall time up to the
    last write to its log."""
    import json
    import os

    (tmp_path / "seed0" / "checkpoints").mkdir(parents=True)
    (tmp_path / "seed0" / "checkpoints" / "latest").write_text("update_000010")
    (tmp_path / "wall_seconds.json").write_text(json.dumps({"0": 60.0, "commits": {"0": "aaa"}}))
    monkeypatch.setattr(reproduce, "git_commit", lambda: "bbb")

    def killed(cmd, **kwargs):  # what the wall file holds when the kill lands mid-life
        recorded = json.loads((tmp_path / "wall_seconds.json").read_text())
        assert recorded["resumed"]["0"] == [{"from_env_steps": None, "commit": "bbb"}]
        assert recorded["0"] == 60.0 and "0" in recorded["running"]
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce.subprocess, "run", killed)
    with pytest.raises(KeyboardInterrupt):
        reproduce.main(["metaworld_reach_ppo", "--seeds", "1", "--out", str(tmp_path)])
    recorded = json.loads((tmp_path / "wall_seconds.json").read_text())
    log = tmp_path / "seed0.log"
    os.utime(log, (recorded["running"]["0"] + 100.0,) * 2)  # the killed life last wrote 100 s in

    def finishes(cmd, **kwargs):
        (tmp_path / "seed0" / "summary.json").write_text(json.dumps(_summary({"a": 0.2}, {"a": 0.7})))
        return reproduce.subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(reproduce.subprocess, "run", finishes)
    assert reproduce.main(["metaworld_reach_ppo", "--seeds", "1", "--out", str(tmp_path)]) == 0
    recorded = json.loads((tmp_path / "wall_seconds.json").read_text())
    assert 160.0 <= recorded["0"] < 170.0  # 60 s first life + 100 s killed life + this short one
    assert recorded["running"] == {} and len(recorded["resumed"]["0"]) == 2


def test_a_life_killed_after_its_summary_still_counts_its_wall_time(tmp_path, monkeypatch):
    """The seconds between the summary's write and the command's return: the seed is done, and the
    killed life's wall time is counted when the next run keeps it."""
    import json
    import os
    import time

    (tmp_path / "seed0").mkdir()
    (tmp_path / "seed0" / "summary.json").write_text(json.dumps(_summary({"a": 0.2}, {"a": 0.7})))
    started = time.time() - 1000.0
    (tmp_path / "wall_seconds.json").write_text(json.dumps({"commits": {"0": "aaa"}, "running": {"0": started}}))
    (tmp_path / "seed0.log").write_text("trained\n")
    os.utime(tmp_path / "seed0.log", (started + 300.0,) * 2)
    monkeypatch.setattr(reproduce.subprocess, "run", lambda *a, **k: pytest.fail("a finished seed was rerun"))
    assert reproduce.main(["metaworld_reach_ppo", "--seeds", "1", "--out", str(tmp_path)]) == 0
    recorded = json.loads((tmp_path / "wall_seconds.json").read_text())
    assert recorded["0"] == pytest.approx(300.0) and recorded["running"] == {}
    assert (
        "Wall seconds per seed (whole command: start-up, evaluations, training): 300"
        in (tmp_path / "results.md").read_text()
    )


def test_all_success_bound_matches_scipys_clopper_pearson():
    stats = pytest.importorskip("scipy.stats")
    for n in (10, 20, 50, 200):
        # the two-sided 90% exact interval's lower end is the one-sided 95% bound
        low = stats.binomtest(n, n).proportion_ci(confidence_level=0.90, method="exact").low
        assert reproduce.all_success_bound(n) == pytest.approx(low, rel=1e-9)


def test_the_page_pairs_each_seeds_final_episodes_with_its_starts(tmp_path):
    from rlfleet.eval.paired import BEFORE_EPISODES_FILE, write_episodes

    def episodes(task: str, outcomes: list[int]) -> list[dict]:
        return [{"task": task, "seed": 100 + j, "success": bool(ok)} for j, ok in enumerate(outcomes)]

    start = episodes("a", [1, 1, 1, 1, 0, 0, 0, 0]) + episodes("b", [1, 1])
    write_episodes(start, tmp_path / "seed0", BEFORE_EPISODES_FILE)
    write_episodes(episodes("a", [1, 1, 1, 0, 1, 1, 1, 1]) + episodes("b", [1, 1]), tmp_path / "seed0")
    (tmp_path / "seed1").mkdir()  # a run from before the episode files: no column
    write_episodes(start, tmp_path / "seed2", BEFORE_EPISODES_FILE)
    write_episodes(episodes("a", [0, 0, 0, 0, 0, 0, 0, 0]) + episodes("b", [1, 0]), tmp_path / "seed2")
    lines = reproduce.paired_lines([tmp_path / f"seed{s}" for s in range(3)])
    assert "| task | seed 0 | seed 2 |" in lines
    # a: seed 0 gains 4 and loses 1 (2 * P(X <= 1), X ~ Bin(5, 1/2) = 0.375); seed 2 loses 4 (0.125)
    assert "| a | +4 / -1 (p 0.38) | +0 / -4 (p 0.12) |" in lines
    assert "| b | +0 / -0 (p 1) | +0 / -1 (p 1) |" in lines
    page = reproduce.results_markdown(
        "toy", reproduce.aggregate(SUMMARIES), ["x"], "abc", [1.0] * 3, {}, "8 episodes", paired=lines
    )
    assert "| a | +4 / -1 (p 0.38) |" in page and "only the start solved" in page
    assert reproduce.paired_lines([tmp_path / "seed1"]) == []


def test_a_one_seed_page_says_seed():
    page = reproduce.results_markdown("toy", reproduce.aggregate(SUMMARIES[:1]), ["x"], "abc", [1.0], {}, "10 episodes")
    assert page.startswith("## toy: 1 seed\n") and "over 1 training seed;" in page


def test_average_last_evaluates_each_seeds_averaged_checkpoints_and_reports_them(tmp_path, capsys):
    """`--average-last 2` on finished seeds: `rlfleet average` and `rlfleet eval` (real processes)
    per seed on the run's held-out episodes, a table beside the final policy's and the pairing with
    the start; a second run keeps those evaluations, and --report-only needs them."""
    import json
    import subprocess
    import sys

    import torch

    from rlfleet.config import load_config, to_yaml
    from rlfleet.eval.paired import BEFORE_EPISODES_FILE, read_episodes, write_episodes
    from rlfleet.learner.checkpointer import Checkpointer, TrainerCounters
    from rlfleet.policies.checkpoint_io import model_config, policy_from_config

    env = {"name": "metaworld", "task": "reach-v3", "max_episode_steps": 20, "chunk_size": 1, "image_size": 0}
    policy_cfg = {"name": "gaussian_mlp", "hidden_sizes": [8]}
    overrides = ["env.task=reach-v3", "env.max_episode_steps=20", "env.chunk_size=1", "eval.episodes_per_task=2"]
    cfg = load_config("metaworld_reach_ppo", overrides)
    for seed in (0, 1):
        run = tmp_path / f"seed{seed}"
        checkpointer = Checkpointer(run)
        for update in (1, 2, 3):
            torch.manual_seed(10 * seed + update)
            policy = policy_from_config(policy_cfg, 39, 4, 1)
            counters = TrainerCounters(update=update, env_steps=64 * update)
            checkpointer.save(
                policy, torch.optim.Adam(policy.parameters()), counters, model_config(policy_cfg, 39, 4, 1, env)
            )
        (run / "config.yaml").write_text(to_yaml(cfg))
        (run / "summary.json").write_text(json.dumps(_summary({"reach-v3": 0.5}, {"reach-v3": 0.5})))
        start = [{"task": "reach-v3", "seed": 10_000 + j, "success": j == 0} for j in range(2)]
        write_episodes(start, run, BEFORE_EPISODES_FILE)
        if seed:  # seed 0 as a run from before final episodes were kept: its start's episodes count
            write_episodes(start, run)
    common = ["metaworld_reach_ppo", "--seeds", "2", "--out", str(tmp_path), *overrides]
    argv = [*common, "--average-last", "2"]
    assert reproduce.main(argv) == 0
    page = (tmp_path / "results.md").read_text()
    assert "### The mean of each seed's last 2 checkpoints" in page
    agg = json.loads((tmp_path / "results.json").read_text())
    assert agg["average"]["averaged_from"] == [["update_000002", "update_000003"]] * 2
    rates = []
    for seed in (0, 1):
        episodes = read_episodes(tmp_path / f"seed{seed}" / reproduce.AVERAGE_EPISODES)
        assert [(r["task"], r["seed"]) for r in episodes] == [("reach-v3", 10_000), ("reach-v3", 10_001)]
        rates.append(sum(r["success"] for r in episodes) / 2)
    row = agg["average"]["tasks"]["reach-v3"]
    assert row["after"][0] == pytest.approx(sum(rates) / 2) and row["before"][0] == pytest.approx(0.5)
    assert f"| reach-v3 | 50.0 +- 0.0 | 50.0 +- 0.0 | {100 * row['after'][0]:.1f} +- " in page
    assert "only the average solved" in page
    # kept: a second run evaluates nothing again, and the page is the same
    stamp = (tmp_path / "seed0" / "checkpoints" / "average" / "eval" / "eval.json").stat().st_mtime_ns
    assert reproduce.main(argv) == 0
    assert (tmp_path / "seed0" / "checkpoints" / "average" / "eval" / "eval.json").stat().st_mtime_ns == stamp
    assert (tmp_path / "results.md").read_text() == page
    # an evaluation of the average on other episodes (by hand, into the same report folder) is not reused
    average = tmp_path / "seed0" / "checkpoints" / "average"
    hand = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "eval", str(average), "--episodes", "1", "--seed", "20000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert hand.returncode == 0, hand.stderr[-3000:]
    assert reproduce.main(argv) == 0
    assert (tmp_path / "results.md").read_text() == page  # evaluated again on the run's episodes
    assert len(read_episodes(average / "eval")) == 2
    # --report-only never evaluates: with no evaluation of the average it says so, keeping the main page
    assert reproduce.main([*common, "--average-last", "3", "--report-only"]) == 1
    assert "no evaluation of its last 3 checkpoints' average" in capsys.readouterr().err
    kept = (tmp_path / "results.md").read_text()
    assert "| reach-v3 |" in kept and "### The mean of each seed's" not in kept


def test_each_seed_gets_its_own_sft_start_unless_shared():
    own = reproduce.seed_command("r", 2, Path("out/seed2"), ["sft.steps=5"])
    assert own[3:7] == ["runner.seed=2", "env.seed=2", "sft.seed=2", "eval.before=true"]
    assert own[-1] == "sft.steps=5"  # overrides come last and win, an sft.seed among them too
    assert "sft.seed=2" not in reproduce.seed_command("r", 2, Path("out/seed2"), [], own_sft=False)


def test_the_page_says_where_each_seeds_start_came_from(tmp_path):
    for seed, start in enumerate(("cache/sft-a", "cache/sft-b")):
        (tmp_path / f"seed{seed}").mkdir()
        (tmp_path / f"seed{seed}" / "config.yaml").write_text(f"policy:\n  model_path: {start}\n")
    starts = reproduce.sft_starts([tmp_path / "seed0", tmp_path / "seed1", tmp_path / "none"])
    assert starts == ["cache/sft-a", "cache/sft-b", ""]
    assert reproduce.sft_note(starts[:2], False).startswith("Each seed is a full repeat: its own SFT start")
    shared = reproduce.sft_note(["cache/sft-a", "cache/sft-a"], True)
    assert "share their starting policy (`--shared-sft`)" in shared and "seed 1: `cache/sft-a`" in shared
    assert reproduce.sft_note(["", ""], False) == ""  # runs from scratch: nothing to say
    page = reproduce.results_markdown(
        "toy", reproduce.aggregate(SUMMARIES), ["x"], "abc", [1.0] * 3, {}, "10", sft_note=starts[0]
    )
    assert page.split("\n")[2] == "cache/sft-a"


def test_the_page_gives_the_binomial_error_of_one_evaluation():
    assert reproduce.binomial_se(0.5, 100) == pytest.approx(0.05)
    assert reproduce.binomial_se(1.0, 50) == 0.0 and math.isnan(reproduce.binomial_se(0.5, 0))
    agg = reproduce.aggregate(SUMMARIES)  # mean before 0.30, after 0.75, 2 tasks
    errors = reproduce.binomial_errors(agg, 50)
    assert errors["episodes"] == 100
    assert errors["before"] == pytest.approx(math.sqrt(0.3 * 0.7 / 100))
    assert errors["after"] == pytest.approx(math.sqrt(0.75 * 0.25 / 100))
    page = reproduce.results_markdown("toy", agg, ["x"], "abc", [1.0] * 3, {}, "50", episodes_per_task=50)
    assert "4.6 points before and 4.3 after on the mean (100 episodes), at most 7.1 on one task (50 episodes)" in page
