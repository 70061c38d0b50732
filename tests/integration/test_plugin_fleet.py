"""The example plugin package (examples/rlfleet_plugin_example) installed with pip and found by name,
through its entry points, in every role: local `rlfleet train`, the roles started one by one, and
`rlfleet env-server`. The test process itself never imports the plugin: only the roles see it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from role_processes import TINY

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rlfleet_plugin_example"
PLUGIN = ["env.name=point_reach", "policy.name=linear_gaussian", "policy.hidden_sizes=[]", "policy.init_log_std=-1.0"]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> str:
    """pip-install the example into a private folder (no build isolation: no network needed;
    the source is copied so pip's build files stay out of the repository)."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = root / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (target / "rlfleet_plugin_example").is_dir()
    return str(target)


@pytest.fixture
def with_plugin(plugin_path, monkeypatch) -> str:
    """Put the plugin on the PYTHONPATH every role (and their env workers) inherit."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (plugin_path, os.environ.get("PYTHONPATH")) if p))
    return plugin_path


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_plugin_is_not_visible_without_its_path() -> None:
    res = _cli("train", "metaworld_reach_ppo", *TINY, *PLUGIN, timeout=120)
    assert res.returncode == 2
    line = [ln for ln in res.stderr.splitlines() if "point_reach" in ln]
    assert len(line) == 1 and "rlfleet.envs" in line[0] and "metaworld" in line[0]  # what was looked up, what exists


def test_plugin_trains_in_local_mode(with_plugin, tmp_path) -> None:
    run = tmp_path / "run"
    res = _cli(
        "train",
        "metaworld_reach_ppo",
        *TINY,
        *PLUGIN,
        "runner.total_env_steps=384",
        f"runner.logger.log_path={run}",
        timeout=400,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 5 and summary["env_steps"] >= 384
    assert set(summary["eval_success"]) == {"point-reach"}  # evaluated on the plugin env
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    saved = json.loads((ckpt / "config.json").read_text())
    assert "linear_gaussian" in json.dumps(saved)
    ev = _cli("eval", str(ckpt), "--episodes", "2", "--json", timeout=200)  # eval rebuilds both by name
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert [row["task"] for row in json.loads(ev.stdout.strip().splitlines()[-1])["tasks"]] == ["point-reach"]


def test_plugin_trains_role_by_role(with_plugin, roles, tmp_path) -> None:
    run = tmp_path / "run"
    learner, laddr = roles.learner(run, *PLUGIN, "runner.total_env_steps=384")
    inference, iaddr = roles.inference(laddr)
    actor = roles.actor("actor-shm", laddr, iaddr, "shm")
    assert roles.wait(learner, "learner", 400) == 0, roles.log("learner")[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 5 and summary["segments_by_client"].get("actor-shm", 0) > 0
    assert set(summary["eval_success"]) == {"point-reach"}
    for name, proc in (("inference", inference), ("actor-shm", actor)):
        assert roles.wait(proc, name, 60) == 0, roles.log(name)[-3000:]


def test_env_server_serves_the_plugin(with_plugin, roles, tmp_path) -> None:
    from rlfleet.envs import EnvConfig, make_env

    (tmp_path / "env.json").unlink(missing_ok=True)
    proc = roles.start(
        "env", "env-server", "--env", "point_reach", "--address-file", str(tmp_path / "env.json"), "max_episode_steps=5"
    )
    address = roles.wait_address("env", proc)["env"]
    with make_env(EnvConfig(name=f"remote://{address}", chunk_size=2), 3) as env:
        obs = env.reset(np.arange(3))
        assert obs["states"].shape == (3, 2) and env.task_list == ["point-reach"]
        done = np.zeros(3, bool)
        for _ in range(3):  # 6 steps > max_episode_steps 5: every episode truncates once
            res = env.chunk_step(np.zeros((3, 2, 1), np.float32))
            done |= res.truncated
        assert done.all()
