"""The RoboTwin-style and CALVIN-style envs through the real fleet (learner, inference server and
actor processes on loopback), state-only with the MLP policy, then an evaluation-only run
(`runner.only_eval`, RLinf's *_eval recipes) of the checkpoint it wrote."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from role_processes import TINY

from rlfleet.eval.paired import read_episodes

SUITES = {
    "robotwin": [
        "env.name=robotwin",
        "env.task=click_bell,place_empty_cup",
        "env.max_episode_steps=40",
        "env.reward_type=dense",
        "eval_env.task=click_bell:eval,place_empty_cup:eval",
    ],
    "calvin": [
        "env.name=calvin",
        "env.task=D",
        "env.max_episode_steps=40",
        "env.reward_type=success",
        "env.subtask_steps=20",  # training only: evaluation keeps the env's own budget
        "eval.every_updates=2",  # periodic evaluation on the held-out chains
    ],
}
NEEDS = {"robotwin": "sapien", "calvin": "pybullet"}


def _cli(*args, timeout: int):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_short_fleet_run_then_eval_only(tmp_path, suite):
    pytest.importorskip(NEEDS[suite])
    run = tmp_path / "run"
    common = [*TINY, *SUITES[suite], "eval.episodes_per_task=1"]
    res = _cli(
        "train",
        "metaworld_reach_ppo",
        *common,
        "runner.total_env_steps=480",
        f"runner.logger.log_path={run}",
        "eval.before=true",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    # written before the fleet starts, so a failed start keeps it
    assert json.loads((run / "eval_before.json").read_text()) == summary["eval_before"]
    assert summary["updates"] >= 5 and summary["env_steps"] >= 480
    if suite == "calvin":  # CALVIN's table: success_len_1..5 and avg_num_subtasks, also as Markdown
        assert {"avg_num_subtasks", "success_len_5"} <= set(summary["eval_chain"]["all"])
        assert "avg_num_subtasks" in (run / "eval_chain.md").read_text()
        # the starting policy's chains next to the trained one's (same eval chains)
        assert {"avg_num_subtasks", "success_len_5"} <= set(summary["eval_chain_before"]["all"])
        table = (run / "before_after_chain.md").read_text()
        assert "| calvin-D before |" in table and "| calvin-D after |" in table and "| all after |" in table
        # a chained env's numbers on screen and in the log are its chain metrics, not only success_once
        assert "starting policy chains: avg_num_subtasks" in res.stderr
        assert re.search(r"eval at \d+ env steps: success_once [\d.]+, avg_num_subtasks [\d.]+", res.stderr)
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()

    # `rlfleet eval` of the run's checkpoint evaluates as the run did (RoboTwin: its eval_env.task's
    # held-out X:eval scenes; CALVIN: the eval chain pool), so the final evaluation replays.
    ev = _cli("eval", str(ckpt), "--episodes", "1", "--compare", str(run), "--json", timeout=300)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "evaluating on the run's evaluation env" in ev.stderr  # --json: stdout holds the JSON alone
    paired = json.loads(ev.stdout)["paired"]  # nothing but the JSON on stdout, simulators' prints included
    assert {row["task"] for row in paired["tasks"]} == set(summary["eval_success"])
    assert all(row["pairs"] == 1 and row["only_this"] == row["only_other"] == 0 for row in paired["tasks"])
    assert read_episodes(ckpt / "eval") == read_episodes(run)
    if suite == "calvin":  # named by --task, the checkpoint's own env, still at the env's subtask budget
        ev = _cli("eval", str(ckpt), "--task", "D", "--episodes", "1", "--out", str(tmp_path / "by_task"), timeout=300)
        assert ev.returncode == 0, ev.stderr[-3000:]
        assert read_episodes(tmp_path / "by_task") == read_episodes(run)

    only = tmp_path / "eval_only"
    res = _cli(
        "train",
        "metaworld_reach_ppo",
        *common,
        "runner.only_eval=true",
        f"policy.model_path={ckpt}",
        f"runner.logger.log_path={only}",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((only / "summary.json").read_text())
    assert set(result["eval_success"]) == set(summary["eval_success"])
    assert (only / "eval.md").exists() and not (only / "checkpoints").exists()
    if suite == "calvin":  # an evaluation-only run of a chained env reports its chains too
        assert {"avg_num_subtasks", "success_len_5"} <= set(result["eval_chain"]["all"])
        assert "avg_num_subtasks" in (only / "eval_chain.md").read_text()
        assert "avg_num_subtasks" in res.stdout
