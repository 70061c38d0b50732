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
        "learner.batch_samples=256",
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
    assert res.returncode == 2  # the learner refused its input (exit 2): bad input for the command too
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
        "learner.batch_samples=256",
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
    # an exported folder is an upload: its evaluation report goes beside it, not into it
    export = tmp_path / "export"
    assert _cli("export", str(ckpt), str(export), timeout=120).returncode == 0
    files = sorted(p.name for p in export.iterdir())
    ev = _cli("eval", str(export), "--episodes", "1", timeout=300, pythonpath=str(pkg))
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert sorted(p.name for p in export.iterdir()) == files
    assert (tmp_path / "export-eval" / "eval.json").is_file() and f"report: {tmp_path / 'export-eval'}" in ev.stdout
    missing = _cli("eval", str(tmp_path / "no" / "such"), timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip().endswith(f"{tmp_path / 'no' / 'such'} does not exist")


def _wait_for(path, proc, timeout: float = 300.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the learner did not come up"
        time.sleep(0.2)


def test_an_actor_that_cannot_make_its_env_says_why_and_the_learner_logs_its_death(tmp_path) -> None:
    """Roles by hand: the learner's host has the env's package, the actor's does not. The actor
    exits 2 with one line; the learner logs the death with its cause and gives the index to the next
    actor; Ctrl-C (SIGINT) of the learner exits 130 saying where its last checkpoint is."""
    import signal

    pkg = tmp_path / "pkg"
    (pkg / "userpkg").mkdir(parents=True)
    (pkg / "userpkg" / "__init__.py").write_text(USER_PACKAGE)
    run, address = tmp_path / "run", tmp_path / "learner.json"
    path = os.pathsep.join([str(pkg), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    learner = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.cli", "learner", RECIPE, f"runner.logger.log_path={run}",
         "env.name=gym:userpkg:userpkg/Walk-v0", "--address-file", str(address)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        _wait_for(address, learner)
        learner_addr = json.loads(address.read_text())["learner"]
        for name in ("a1", "a2"):
            res = _cli("actor", "--learner", learner_addr, "--inference", "127.0.0.1:1", "--id", name, timeout=120)
            assert res.returncode == 2, res.stderr[-3000:]
            lines = res.stderr.strip().splitlines()
            assert "Traceback" not in res.stderr and len(lines) <= 2, res.stderr  # its own log line, then the error
            assert "ERROR rlfleet" in lines[-1] and "cannot make env 'gym:userpkg:userpkg/Walk-v0': " in lines[-1]
            assert "No module named 'userpkg'" in lines[-1]
    finally:
        learner.send_signal(signal.SIGINT)
        out, err = learner.communicate(timeout=120)
    assert learner.returncode == 130, err[-3000:]
    assert "interrupted; last checkpoint: " in err
    died = [ln for ln in err.splitlines() if "died:" in ln]
    assert len(died) == 2 and all("(index 0) died: cannot make env" in ln for ln in died), died  # a2 reused a1's index


def test_ctrl_c_of_train_says_interrupted_and_where_the_last_checkpoint_is(tmp_path) -> None:
    import signal
    import time

    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    train = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.cli", "train", RECIPE, f"runner.logger.log_path={run}",
         "runner.total_env_steps=10000000", "runner.checkpoint_every=1", "learner.batch_samples=256",
         "actor.num_envs=4", "actor.rollout_len=16", "eval.at_end=false"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "latest").exists():
        assert train.poll() is None and time.monotonic() < deadline, "no checkpoint came"
        time.sleep(0.2)
    train.send_signal(signal.SIGINT)  # Ctrl-C reaches the launcher; it stops the roles
    out, err = train.communicate(timeout=180)
    assert train.returncode == 130, err[-3000:]
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert err.strip().splitlines()[-1] == f"interrupted; last checkpoint: {run / 'checkpoints' / latest}"
