"""Helpers to run real rlfleet role processes on loopback (imported by the integration tests;
a plain module, since several test folders have a conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TINY = [
    "env.task=reach-v3",
    "env.max_episode_steps=20",
    "actor.num_envs=4",
    "actor.num_workers=1",
    "actor.pipeline_stage_num=2",
    "actor.rollout_len=8",
    "learner.batch_samples=64",
    "learner.ingest_queue_size=4",
    "runner.checkpoint_every=2",
    "runner.max_wall_seconds=0",
    "eval.episodes_per_task=2",
    "policy.hidden_sizes=[32,32]",
]


class Roles:
    """Starts `rlfleet` subcommands as real processes and always cleans them up."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def wait_address(self, name: str, proc: subprocess.Popen, timeout: float = 120) -> dict:
        path = self.tmp / f"{name}.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                return json.loads(path.read_text())
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited early:\n{self.log(name)[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"{name} did not start:\n{self.log(name)[-3000:]}")

    def learner(self, run_dir: Path, *overrides: str, resume: bool = False) -> tuple[subprocess.Popen, str]:
        args = [
            "learner",
            "metaworld_reach_ppo",
            *TINY,
            f"runner.logger.log_path={run_dir}",
            *overrides,
            "--address-file",
            str(self.tmp / "learner.json"),
        ]
        (self.tmp / "learner.json").unlink(missing_ok=True)
        proc = self.start("learner", *args, *(["--resume"] if resume else []))
        return proc, self.wait_address("learner", proc)["learner"]

    def inference(self, learner_addr: str) -> tuple[subprocess.Popen, str]:
        (self.tmp / "inference.json").unlink(missing_ok=True)
        proc = self.start(
            "inference", "inference", "--learner", learner_addr, "--address-file", str(self.tmp / "inference.json")
        )
        return proc, self.wait_address("inference", proc)["inference"]

    def actor(self, name: str, learner_addr: str, inference_addr: str, transport: str) -> subprocess.Popen:
        return self.start(
            name,
            "actor",
            "--learner",
            learner_addr,
            "--inference",
            inference_addr,
            "--transport",
            transport,
            "--id",
            name,
        )

    def env_server(self, port: int, task: str = "reach-v3", episode_steps: int = 20) -> subprocess.Popen:
        """`rlfleet env-server` serving MetaWorld states (no renderer) on `port`, started and
        listening (its address file written) when this returns."""
        (self.tmp / "env.json").unlink(missing_ok=True)
        proc = self.start(
            "env",
            "env-server",
            *("--env", "metaworld", "--task", task, "--port", str(port)),
            *("--address-file", str(self.tmp / "env.json")),
            f"max_episode_steps={episode_steps}",
            "image_size=0",
        )
        self.wait_address("env", proc)
        return proc

    def wait(self, proc: subprocess.Popen, name: str, timeout: float) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout}s:\n{self.log(name)[-3000:]}") from None

    def kill_group(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                self.kill_group(p, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill_group(p)
                p.wait()
