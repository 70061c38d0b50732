"""Evaluation episodes are held out: no training env stream or demo seed replays them."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.config import eval_seed_range, load_config
from rlfleet.data.demos import DEMO_SEED_BASE
from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import make_env


def test_training_streams_never_replay_an_eval_episode():
    # env.seed equal to an eval seed is the case that used to collide: numpy seeds default_rng(s)
    # exactly as SeedSequence([s, 0]), which was env 0's training stream
    cfg = EnvConfig(name="metaworld", task="reach-v3", seed=10_000)
    eval_seeds = np.arange(10_000, 10_004)
    with make_env(cfg, 4) as train, make_env(cfg, 4) as ev:
        train_states = train.reset()["states"]
        eval_states = ev.reset(eval_seeds)["states"]
    for row in train_states:  # reach-v3's goal and hand start are in the state: a replay would match
        assert not any(np.allclose(row, e) for e in eval_states)
    assert np.array_equal(
        np.random.default_rng(10_000).random(3), np.random.default_rng(np.random.SeedSequence([10_000, 0])).random(3)
    )


def test_eval_seed_range_stays_below_the_demo_seeds():
    cfg = load_config("metaworld_quickstart_tinyoft")
    seeds = eval_seed_range(cfg, 5)
    assert seeds.start == cfg.eval.seed and len(seeds) == 5 * cfg.eval.episodes_per_task
    assert seeds.stop <= DEMO_SEED_BASE
    cfg.eval.periodic_episodes_per_task = 1_000_000  # the larger episode count decides the range
    with pytest.raises(ValueError, match="demo"):
        eval_seed_range(cfg, 5)
