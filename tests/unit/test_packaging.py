"""The core install carries no simulator: everything but the env adapters imports without them, and
choosing a simulator whose extra is missing is one line naming the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
SIMULATORS = ["metaworld", "mujoco", "gymnasium", "pybullet", "pybullet_data", "sapien", "scipy"]

# Python, with the simulators made unimportable (sys.modules[name] = None), then rlfleet's CLI
_NO_SIM = textwrap.dedent(f"""
    import sys
    for name in {SIMULATORS!r}:
        sys.modules[name] = None
    import importlib
    core = ("rlfleet.wire.codec", "rlfleet.wire.gen.learner_pb2_grpc", "rlfleet.algorithms.ppo",
                "rlfleet.policies.registry", "rlfleet.policies.vla", "rlfleet.envs.remote", "rlfleet.envs.env_server",
                "rlfleet.actors.actor", "rlfleet.inference_server.server", "rlfleet.learner.main",
                "rlfleet.runs.launcher", "rlfleet.eval.episodes", "rlfleet.eval.report", "rlfleet.policies.hub",
                "rlfleet.telemetry.trackers")
    for mod in core if sys.argv[1] == "recipes" else ():
        importlib.import_module(mod)
    from rlfleet.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def _run_without_simulators(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _NO_SIM, *args], capture_output=True, text=True, timeout=180)


def test_core_modules_and_cli_work_without_any_simulator():
    res = _run_without_simulators("recipes")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "metaworld_reach_ppo" in res.stdout.split() and "node_reach2d_ppo" in res.stdout.split()


def test_a_simulator_without_its_extra_is_one_line():
    for recipe, extra in (
        ("metaworld_reach_ppo", "metaworld"),
        ("robotwin_multitask_ppo_mlp_cpu", "robotwin"),
        ("calvin_d_d_ppo_tinypi0_cpu", "calvin"),
    ):
        res = _run_without_simulators("train", recipe)
        assert res.returncode == 2, res.stderr[-3000:]
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and f'pip install "rlfleet[{extra}]"' in lines[0], res.stderr


def test_extras_and_package_data():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = meta["project"]
    core = " ".join(project["dependencies"])
    for sim in ("metaworld", "mujoco", "gymnasium", "pybullet", "sapien", "wandb", "pyarrow", "transformers", "peft"):
        assert sim not in core, sim
    extras = project["optional-dependencies"]
    assert {"metaworld", "robotwin", "calvin", "gym", "trackers", "hf", "lerobot", "all", "dev"} <= set(extras)
    assert extras["all"] == ["rlfleet[metaworld,robotwin,calvin,gym,trackers,hf,lerobot]"]
    data = meta["tool"]["setuptools"]["package-data"]["rlfleet"]
    for pattern in data:  # every pattern names files that exist (a stale one ships nothing)
        assert list((REPO / "rlfleet").glob(pattern)), pattern
