"""gymnasium's MuJoCo InvertedPendulum-v5 (`env.name=gym:InvertedPendulum-v5`) trained through the
whole fleet by `rlfleet train`, then scored by `rlfleet eval` (mean episode return)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("mujoco") is None:  # not imported here: this process's GL backend stays unset
    pytest.skip("gymnasium's MuJoCo envs need mujoco", allow_module_level=True)

RECIPE = "gym_inverted_pendulum_ppo"


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _train_and_eval(tmp_path, *overrides: str, timeout: float) -> tuple[dict, float]:
    run = tmp_path / "run"
    res = _cli(
        "train", RECIPE, f"runner.logger.log_path={run}", "runner.max_wall_seconds=0", *overrides, timeout=timeout
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    ev = _cli("eval", str(ckpt), "--episodes", "5", "--json", timeout=300)
    assert ev.returncode == 0, ev.stderr[-3000:]
    table = json.loads(ev.stdout.strip().splitlines()[-1])
    return summary, table["mean_return"]["InvertedPendulum-v5"]


def test_a_few_updates_through_the_fleet(tmp_path) -> None:
    summary, mean_return = _train_and_eval(
        tmp_path,
        "runner.total_env_steps=1024",
        "learner.batch_env_steps=256",
        "actor.num_envs=4",
        "actor.rollout_len=16",
        "env.max_episode_steps=50",
        "eval.episodes_per_task=2",
        timeout=400,
    )
    assert summary["updates"] >= 4 and summary["env_steps"] >= 1024
    assert set(summary["eval_success"]) == {"InvertedPendulum-v5"}
    assert 1.0 <= mean_return <= 50.0  # at least one step survived, at most the episode limit
    # the run's own final evaluation reports the return too: what this env is judged by
    final = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(final) == 2
    assert summary["eval_mean_return"] == {"InvertedPendulum-v5": sum(r["return"] for r in final) / 2}


@pytest.mark.slow
def test_recipe_balances_the_pendulum(tmp_path) -> None:
    """The recipe as shipped (150k env steps): the deterministic policy balances for most of the
    500-step episode (the initial policy: ~26, see docs/simulators.md)."""
    summary, mean_return = _train_and_eval(tmp_path, timeout=900)
    assert summary["env_steps"] >= 150_000
    assert mean_return >= 400.0


def test_an_env_the_learner_refuses_ends_the_run_in_one_line_per_process(tmp_path):
    """A role that exits before it is ready (here the learner, on a Discrete-action env) ends
    `rlfleet train` with its own reason and one line from the launcher, not a traceback."""
    res = _cli("train", RECIPE, f"runner.logger.log_path={tmp_path / 'run'}", "env.name=gym:CartPole-v1", timeout=300)
    assert res.returncode == 1
    assert "has a Discrete action space; rlfleet needs a Box" in res.stderr
    assert "learner exited with code 2 before it was ready" in res.stderr and "Traceback" not in res.stderr
