"""The state-based CALVIN recipe end to end: expert chains, SFT of an MLP that reads the
instruction, RL through learner, inference server and actor processes, chain metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_state_calvin_recipe_runs_from_bootstrap_to_chain_metrics(tmp_path):
    pytest.importorskip("pybullet")
    run = tmp_path / "run"
    overrides = [
        "demos.episodes_per_task=2",
        f"demos.cache_dir={tmp_path / 'cache'}",
        "sft.steps=20",
        "sft.batch_size=32",
        "sft.eval_episodes_per_task=0",
        "actor.num_envs=2",
        "actor.num_workers=1",
        "actor.rollout_len=4",
        "learner.batch_samples=32",
        "algorithm.critic_warmup_updates=0",  # the actor's update runs too
        "runner.total_env_steps=512",
        "runner.max_wall_seconds=0",
        "eval.episodes_per_task=1",
        f"runner.logger.log_path={run}",
    ]
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "train", "calvin_d_d_ppo_mlp_cpu", *overrides],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 3 and summary["rejected_segments"] == 0
    for key in ("eval_chain", "eval_chain_before"):
        assert 0.0 <= summary[key]["all"]["avg_num_subtasks"] <= 5.0
    from rlfleet.policies.checkpoint_io import load_checkpoint

    policy, _ = load_checkpoint(run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip())
    assert policy.obs_keys == ("states", "instructions") and policy.cfg.instruction_dim == 32
