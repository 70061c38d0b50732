"""bench/calvin_reach.py: the hand-to-block distance read from the `states` observation, the
block-first chain selection, and the whole script on a fresh tiny_pi0."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pybullet")

_spec = importlib.util.spec_from_file_location(
    "calvin_reach", Path(__file__).resolve().parents[2] / "bench" / "calvin_reach.py"
)
calvin_reach = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calvin_reach)


def test_hand_to_block_matches_the_scene_snapshot():
    from rlfleet.envs.api import EnvConfig
    from rlfleet.envs.calvin.env import CalvinEnv
    from rlfleet.envs.calvin.layout import BLOCK_COLORS

    env = CalvinEnv(EnvConfig(name="calvin", task="D", max_episode_steps=1800, chunk_size=1), 2)
    try:
        obs = env.reset(np.array([3, 4]))
        for i, scene in enumerate(env._scenes):  # the physics snapshot, independent of the observation
            snap = scene.snapshot()
            for color in BLOCK_COLORS:
                want = np.linalg.norm(snap.tcp_pos - snap.block_pos[color])
                got = calvin_reach.hand_to_block(obs["states"][i], color)
                assert got == pytest.approx(want, abs=1e-4)
    finally:
        env.close()


def test_block_first_seeds_are_the_chains_that_start_with_a_block_subtask():
    from rlfleet.envs.calvin.chains import pool_entry, pool_size
    from rlfleet.envs.calvin.subtasks import SUBTASKS

    seeds = calvin_reach.block_first_seeds(10_000, 5)
    first = {s: pool_entry("eval", s % pool_size("eval")).subtasks[0] for s in range(10_000, seeds[-1] + 1)}
    kinds = {s: SUBTASKS[name].kind for s, name in first.items()}
    assert seeds == [s for s, k in kinds.items() if k in ("lift", "push", "rotate")]
    assert len(seeds) == 5 and len(kinds) > 5  # some chains start with a fixture and are skipped


def test_the_script_reports_each_chain(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from rlfleet.config import load_config, policy_settings
    from rlfleet.envs.registry import build_env_config
    from rlfleet.envs.run_shapes import probe_env_dims
    from rlfleet.policies.checkpoint_io import model_config, policy_from_config, save_checkpoint_folder

    cfg = load_config("calvin_d_d_ppo_tinypi0_cpu", ["policy.dim=16", "policy.depth=1", "policy.heads=2"])
    state_dim, action_dim = probe_env_dims(build_env_config(cfg.env))
    torch.manual_seed(0)
    settings = policy_settings(cfg)
    policy = policy_from_config(settings, state_dim, action_dim, cfg.env.chunk_size, cfg.env.image_size)
    config = model_config(settings, state_dim, action_dim, cfg.env.chunk_size, image_size=cfg.env.image_size)
    save_checkpoint_folder(tmp_path / "ckpt", policy, config)

    assert calvin_reach.main([str(tmp_path / "ckpt"), "--chains", "2"]) == 0
    out = capsys.readouterr().out
    assert "(deterministic): 2 chains that start with a block subtask" in out and "completed 0" in out
    travel = re.search(r"hand travel per chunk median ([\d.]+) mm, (\d+)% of (\d+) chunks under 3 mm", out)
    assert travel and float(travel[1]) >= 0 and 0 <= int(travel[2]) <= 100
    assert int(travel[3]) >= 2 * 360 // cfg.env.chunk_size  # each chain's first subtask ran to its limit
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "first subtask" not in line]
    assert len(rows) == 2
    for name, closest, ok in rows:
        assert name.strip("| ").split("_")[0] in ("lift", "push", "rotate")
        assert 0.0 < float(closest) < 150.0 and ok.strip(" |") == "no"


def test_sampled_actions_move_the_hand_more_than_the_mean_of_a_fresh_policy(tmp_path):
    """A fresh policy's mean action barely moves the hand; its samples do (the --sample switch reaches
    the policy)."""
    from rlfleet.config import load_config

    cfg = load_config("calvin_d_d_ppo_mlp_cpu", ["policy.hidden_sizes=[8]"])
    seeds = calvin_reach.block_first_seeds(cfg.eval.seed, 2)
    _, mean_travel = calvin_reach.reach(cfg, seeds)
    _, sampled_travel = calvin_reach.reach(cfg, seeds, sample=True)
    assert np.median(sampled_travel) > 2 * np.median(mean_travel)
