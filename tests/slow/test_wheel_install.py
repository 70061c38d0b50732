"""The wheel, installed into a fresh virtual environment (no system site-packages, no simulator):
`rlfleet --help`, `rlfleet recipes` and a short training run on a remote env (EnvService) work
from it, with the generated gRPC stubs inside the wheel.

Needs the package index pip is configured with (torch comes from `pip install torch==2.13.0`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "env.task=reach-v3",
    "env.max_episode_steps=20",
    "actor.num_envs=4",
    "actor.num_workers=1",
    "actor.pipeline_stage_num=2",
    "actor.rollout_len=8",
    "learner.batch_samples=64",
    "runner.total_env_steps=256",
    "runner.max_wall_seconds=0",
    "eval.episodes_per_task=1",
    "policy.hidden_sizes=[16,16]",
]


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a fresh venv installs torch and every core dependency
def test_wheel_in_a_fresh_venv_runs_a_remote_env_training(tmp_path):
    pytest.importorskip("build", reason="the wheel build needs the `build` package (dev extra)")
    pytest.importorskip("metaworld", reason="the env server this test trains against serves MetaWorld")
    # build from a copy of the tracked tree, so the checkout gets no build/ or egg-info
    src = tmp_path / "src"
    files = _run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard"], 60).stdout.split()
    for name in files:
        if (REPO / name).is_file() and not name.startswith(("tests/", "bench/", "deploy/")):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)], 300)
    (wheel,) = (tmp_path / "dist").glob("rlfleet-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], 120)
    bin_ = venv / "bin"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([str(bin_ / "pip"), "install", "torch==2.13.0"], 600, env=clean)
    _run([str(bin_ / "pip"), "install", str(wheel)], 600, env=clean)
    where = _run(
        [
            str(bin_ / "python"),
            "-c",
            "import importlib.util as u, rlfleet, rlfleet.wire.gen.env_pb2_grpc; "
            "print(rlfleet.__file__); print(all(u.find_spec(m) is None for m in "
            "('metaworld', 'mujoco', 'sapien', 'pybullet', 'wandb')))",
        ],
        120,
        env=clean,
        cwd=tmp_path,
    )
    path, no_sim = where.stdout.split()
    assert path.startswith(str(venv)) and no_sim == "True"

    cli = [str(bin_ / "rlfleet")]
    helptext = _run(cli + ["--help"], 60, env=clean, cwd=tmp_path).stdout
    assert "train" in helptext and "examples:" in helptext
    assert "metaworld_reach_ppo" in _run(cli + ["recipes"], 60, env=clean, cwd=tmp_path).stdout.split()
    missing = subprocess.run(
        cli + ["train", "metaworld_reach_ppo"], capture_output=True, text=True, timeout=120, env=clean, cwd=tmp_path
    )
    assert missing.returncode == 2 and 'pip install "rlfleet[metaworld]"' in missing.stderr

    # the simulator runs elsewhere (this interpreter has MetaWorld); the venv only talks EnvService
    addr_file = tmp_path / "env.json"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet.cli",
            "env-server",
            "--env",
            "metaworld",
            "--task",
            "reach-v3",
            "--address-file",
            str(addr_file),
            "max_episode_steps=20",
            "image_size=0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not addr_file.exists():
            assert server.poll() is None and time.monotonic() < deadline, "env-server did not start"
            time.sleep(0.2)
        address = json.loads(addr_file.read_text())["env"]
        run = tmp_path / "run"
        _run(
            cli
            + ["train", "metaworld_reach_ppo", f"env.name=remote://{address}", *TINY, f"runner.logger.log_path={run}"],
            600,
            env={**clean, "OMP_NUM_THREADS": "1"},
            cwd=tmp_path,
        )
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] >= 256 and set(summary["eval_success"]) == {"reach-v3"}
