"""`rlfleet eval --decode`: tiny_oft's deterministic decoder chosen at evaluation, on a real
checkpoint and a real MetaWorld env; other policies refuse it in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from rlfleet.learner.checkpointer import Checkpointer, TrainerCounters
from rlfleet.policies.checkpoint_io import model_config, policy_from_config

ENV = {"name": "metaworld", "task": "reach-v3", "max_episode_steps": 20, "chunk_size": 4, "image_size": 32}


def _checkpoint(tmp_path: Path, policy_cfg: dict, chunk: int) -> Path:
    torch.manual_seed(0)
    size = ENV["image_size"] if policy_cfg["name"] == "tiny_oft" else 0
    policy = policy_from_config(policy_cfg, 39, 4, chunk, image_size=size)
    env = {**ENV, "chunk_size": chunk, "image_size": size}
    return Checkpointer(tmp_path / "run").save(
        policy,
        torch.optim.Adam(policy.parameters()),
        TrainerCounters(update=1, env_steps=64),
        model_config(policy_cfg, 39, 4, chunk, env, image_size=size),
    )


def _eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "eval", *args], capture_output=True, text=True, timeout=300
    )


def test_eval_decode_median_runs_and_says_so(tmp_path):
    ckpt = _checkpoint(tmp_path, {"name": "tiny_oft", "dim": 32, "depth": 1, "num_bins": 16}, chunk=4)
    res = _eval(str(ckpt), "--decode", "median", "--episodes", "1", "--out", str(tmp_path / "ev"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "median decoding" in res.stdout
    assert (tmp_path / "ev" / "eval.json").exists()


def test_eval_decode_on_a_policy_without_bins_is_one_line(tmp_path):
    ckpt = _checkpoint(tmp_path, {"name": "gaussian_mlp", "hidden_sizes": [8]}, chunk=1)
    res = _eval(str(ckpt), "--decode", "median", "--episodes", "1", "--out", str(tmp_path / "ev"))
    assert res.returncode == 2
    assert "has no settings ['decode']" in res.stderr and "Traceback" not in res.stderr


def test_eval_unknown_decoder_is_one_line(tmp_path):
    ckpt = _checkpoint(tmp_path, {"name": "tiny_oft", "dim": 32, "depth": 1, "num_bins": 16}, chunk=4)
    res = _eval(str(ckpt), "--decode", "mode", "--episodes", "1", "--out", str(tmp_path / "ev"))
    assert res.returncode == 2
    assert "decode must be one of argmax, median, mean" in res.stderr and "Traceback" not in res.stderr
