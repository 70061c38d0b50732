"""bench/calvin_subtasks.py's tally: which subtask a chain was attempting when it stopped."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "calvin_subtasks", Path(__file__).resolve().parents[2] / "bench" / "calvin_subtasks.py"
)
calvin_subtasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calvin_subtasks)


def test_a_chain_attempts_its_subtasks_up_to_the_first_failure():
    chains = [("a", "b", "c"), ("b", "a", "c"), ("a", "c", "b"), ("c", "a", "b")]
    done = [2, 0, 3, 1]  # stops at c; stops at b; all three; stops at a
    rows = calvin_subtasks.tally(chains, done)
    # a: done in chains 0 and 2 (it starts both), failed in chain 3; chain 1 stopped before it
    assert rows["a"] == (3, 2, 2, 2)
    # b: done in chains 0 and 2; failed as first in chain 1
    assert rows["b"] == (3, 2, 1, 0)
    # c: failed in chain 0, done in chains 2 and 3 (first of chain 3)
    assert rows["c"] == (3, 2, 1, 1)
    assert sum(a for a, _, _, _ in rows.values()) == 3 + 1 + 3 + 2  # up to the failure, or the whole chain


def test_the_script_evaluates_a_checkpoint_on_the_eval_chains(tmp_path, capsys):
    """The whole script on a fresh tiny_pi0 (it completes nothing): one row per chain's first
    subtask, attempted once and never completed, as the eval chains' pool entries say. The policy
    reads the gripper camera, which the run's overrides turn on."""
    pytest.importorskip("pybullet")
    from rlfleet.config import load_config, policy_settings
    from rlfleet.envs.calvin.chains import pool_entry, pool_size
    from rlfleet.envs.registry import build_env_config
    from rlfleet.envs.run_shapes import probe_env_dims
    from rlfleet.policies.checkpoint_io import model_config, policy_from_config, save_checkpoint_folder

    wrist = ["env.wrist_camera=true", "policy.wrist_camera=true"]
    cfg = load_config("calvin_d_d_ppo_tinypi0_cpu", ["policy.dim=16", "policy.depth=1", "policy.heads=2", *wrist])
    state_dim, action_dim = probe_env_dims(build_env_config(cfg.env))
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    settings = policy_settings(cfg)
    policy = policy_from_config(settings, state_dim, action_dim, cfg.env.chunk_size, cfg.env.image_size)
    config = model_config(settings, state_dim, action_dim, cfg.env.chunk_size, image_size=cfg.env.image_size)
    save_checkpoint_folder(tmp_path / "ckpt", policy, config)

    assert calvin_subtasks.main([str(tmp_path / "ckpt"), "--chains", "2", *wrist]) == 0
    out = capsys.readouterr().out
    assert "avg_num_subtasks 0.00 over 2 eval chains" in out
    firsts = Counter(pool_entry("eval", (cfg.eval.seed + j) % pool_size("eval")).subtasks[0] for j in range(2))
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| subtask")]
    assert sorted(rows) == sorted(f"| {n} | {c} | 0 (0%) | {c} | 0 |" for n, c in firsts.items())


def test_sample_evaluates_with_sampled_actions(monkeypatch, capsys):
    """`--sample` reaches the evaluation as deterministic=False and the report says so."""
    seen = {}

    def fake_evaluate_start(cfg, deterministic=True, episode_records=None):
        seen["deterministic"] = deterministic
        episode_records += [
            {"task": "D", "seed": 10_000 + j, "scene": j, "return": r} for j, r in enumerate((1.0, 0.0))
        ]
        return {"D": 0.5}, None

    monkeypatch.setattr(calvin_subtasks, "evaluate_start", fake_evaluate_start)
    assert calvin_subtasks.main(["some/ckpt", "--chains", "2", "--sample", "--recipe", "calvin_d_d_ppo_mlp_cpu"]) == 0
    assert seen == {"deterministic": False}
    assert "some/ckpt (sampled): avg_num_subtasks 0.50 over 2 eval chains" in capsys.readouterr().out
