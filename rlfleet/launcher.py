"""Local mode: one command spawns the learner, an inference server and the actors on this host.

Each role is the same `rlfleet` subcommand a user would start by hand in distributed mode;
the launcher only wires their addresses together (through small address files) and makes
sure that when the learner ends, or on Ctrl-C, every child stops and nothing is left behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from rlfleet.config import to_yaml


def _spawn(args: list[str], log_file: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = open(log_file, "ab") if log_file else None
    return subprocess.Popen([sys.executable, "-m", "rlfleet.cli", *args], env=env, stdout=out, stderr=out)


def _wait_address(path: Path, proc: subprocess.Popen, key: str, timeout: float = 180.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())[key]
        if proc.poll() is not None:
            raise RuntimeError(f"{key} exited with code {proc.returncode} before it was ready")
        time.sleep(0.1)
    raise TimeoutError(f"{key} did not report its address within {timeout:.0f}s")


def _stop_all(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def evaluate_start(cfg: DictConfig) -> dict[str, float]:
    """Success of the policy the run starts from (fresh or `policy.model_path`), for before/after."""
    import torch

    from rlfleet.config import as_dict, eval_env_config
    from rlfleet.evaluation import evaluate_policy
    from rlfleet.learner.run import fill_model_dims
    from rlfleet.policies.checkpoint_io import policy_from_config

    torch.manual_seed(cfg.runner.seed)
    fill_model_dims(cfg)
    d = cfg.model_dims
    policy = policy_from_config(as_dict(cfg.policy), d.state_dim, d.action_dim, cfg.env.chunk_size, cfg.env.image_size)
    return evaluate_policy(policy, eval_env_config(cfg), cfg.eval.episodes_per_task, seed=cfg.eval.seed)


def train_local(cfg: DictConfig) -> dict:
    """Bootstrap an SFT checkpoint if the recipe asks for one, then run the fleet on this host."""
    from rlfleet.data.bootstrap import ensure_sft_checkpoint, needs_bootstrap

    run_dir = Path(cfg.runner.logger.log_path)
    if needs_bootstrap(cfg):
        cfg.policy.model_path = str(ensure_sft_checkpoint(cfg))
    before = None
    if cfg.eval.before:
        print("evaluating the starting policy ...", file=sys.stderr, flush=True)
        before = evaluate_start(cfg)
    summary = _run_fleet(cfg, run_dir)
    if before is not None and summary:
        summary["eval_before"] = before
        summary["eval_before_mean"] = sum(before.values()) / len(before)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _run_fleet(cfg: DictConfig, run_dir: Path) -> dict:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    cfg_file = run_dir / "launch_config.yaml"
    cfg_file.write_text(to_yaml(cfg))
    addr_dir = run_dir / "addresses"
    addr_dir.mkdir(exist_ok=True)
    for old in addr_dir.glob("*.json"):
        old.unlink()
    logs = run_dir / "logs"

    learner = _spawn(["learner", str(cfg_file), "--address-file", str(addr_dir / "learner.json")])  # console: progress
    children = [learner]
    try:
        learner_addr = _wait_address(addr_dir / "learner.json", learner, "learner")
        inference = _spawn(["inference", "--learner", learner_addr, "--address-file", str(addr_dir / "inference.json")],
                           logs / "inference.log")
        children.append(inference)
        inference_addr = _wait_address(addr_dir / "inference.json", inference, "inference")
        actors = [
            _spawn(["actor", "--learner", learner_addr, "--inference", inference_addr, "--index", str(i)],
                   logs / f"actor{i}.log")
            for i in range(cfg.actor.num_actors)
        ]
        children.extend(actors)
        learner.wait()
    except KeyboardInterrupt:
        print("\nstopping: the learner writes a checkpoint before it exits", file=sys.stderr)
        learner.send_signal(signal.SIGINT)
        try:
            learner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            learner.kill()
    finally:
        _stop_all(children, grace=15.0)
    summary_file = run_dir / "summary.json"
    if learner.returncode != 0 and not summary_file.exists():
        raise RuntimeError(f"learner exited with code {learner.returncode}; see the output above")
    return json.loads(summary_file.read_text()) if summary_file.exists() else {}
