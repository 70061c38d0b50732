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


def _cli(*args: str, timeout: float, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
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


# A user's package that registers its env on import (as lerobot_env_so101 does): the reward is a
# gym.make argument, success is reported under its own info key.
USER_PACKAGE = """
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Walk(gym.Env):
    def __init__(self, render_mode=None, bonus=0.0):
        self.bonus = bonus
        self.observation_space = spaces.Dict({"agent_pos": spaces.Box(-9, 9, (2,), np.float32)})
        self.action_space = spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"agent_pos": np.zeros(2, np.float32)}, {}

    def step(self, action):
        self.t += 1
        return {"agent_pos": np.full(2, self.t / 10, np.float32)}, self.bonus, False, False, {"done_ok": self.t >= 3}


gym.register(id="userpkg/Walk-v0", entry_point=Walk, max_episode_steps=10)
"""


def test_gym_kwargs_reach_every_process_and_the_task_is_named_by_its_id(tmp_path) -> None:
    """`env.gym_kwargs` make the env in the actors (training returns), the learner's evaluation
    and `rlfleet eval` alike; with the `gym:module:Id` form the task is the id alone everywhere."""
    pkg = tmp_path / "pkg"
    (pkg / "userpkg").mkdir(parents=True)
    (pkg / "userpkg" / "__init__.py").write_text(USER_PACKAGE)
    run = tmp_path / "run"
    res = _cli(
        "train",
        RECIPE,
        f"runner.logger.log_path={run}",
        "runner.max_wall_seconds=0",
        "env.name=gym:userpkg:userpkg/Walk-v0",
        "env.gym_kwargs.bonus=0.5",
        "env.success_key=done_ok",
        "env.max_episode_steps=10",
        "runner.total_env_steps=512",
        "learner.batch_env_steps=256",
        "actor.num_envs=4",
        "actor.rollout_len=16",
        "eval.episodes_per_task=2",
        timeout=400,
        pythonpath=str(pkg),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_success"] == {"userpkg/Walk-v0": 1.0}  # the success key, read by the learner's eval
    assert summary["eval_mean_return"] == {"userpkg/Walk-v0": 5.0}  # 10 steps x the bonus
    assert "never appeared in info" not in res.stderr
    assert summary["train_success_once"] == 1.0  # the actors' envs read the success key too
    # the actors' episodes: return 10 x the bonus; metric tags name the id alone
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert {e.value for e in events.Scalars("env/return")} == {5.0}
    assert "eval/success/userpkg/Walk-v0" in events.Tags()["scalars"]
    assert not [t for t in events.Tags()["scalars"] if "userpkg:" in t]
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    ev = _cli("eval", str(ckpt), "--episodes", "2", "--json", timeout=300, pythonpath=str(pkg))
    assert ev.returncode == 0, ev.stderr[-3000:]
    table = json.loads(ev.stdout.strip().splitlines()[-1])
    assert table["mean_return"] == {"userpkg/Walk-v0": 5.0}
