"""Evaluation episodes are held out: no training env stream or demo seed replays them."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.config import load_config
from rlfleet.data.demos import DEMO_SEED_BASE
from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import build_env_config, make_env
from rlfleet.eval.splits import eval_seed_range


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


# --- the validation split: disjoint from training, demos and test, per env family ------------------


def test_split_seed_bases_live_in_one_place():
    from rlfleet.config import EvalConfig
    from rlfleet.envs.api import EVAL_SPLITS, TEST_SEED_BASE, VALIDATION_SEED_BASE
    from rlfleet.eval.episodes import evaluate_policy
    from rlfleet.eval.splits import split_seed

    ev = EvalConfig()
    assert EVAL_SPLITS == ("test", "validation") and ev.split == "test"
    assert (split_seed(ev), split_seed(ev, "validation")) == (TEST_SEED_BASE, VALIDATION_SEED_BASE)
    assert evaluate_policy.__defaults__ is not None and TEST_SEED_BASE in evaluate_policy.__defaults__
    assert TEST_SEED_BASE < VALIDATION_SEED_BASE < DEMO_SEED_BASE
    with pytest.raises(ValueError, match="split must be one of test, validation"):
        split_seed(ev, "train")


def test_config_split_and_the_start_check_refuse_in_one_line():
    from rlfleet.config import ConfigError

    with pytest.raises(ConfigError, match="eval.split must be one of test, validation, got 'dev'"):
        load_config("metaworld_reach_ppo", ["eval.split=dev"])
    cfg = load_config("metaworld_reach_ppo")
    test, val = eval_seed_range(cfg, 3, "test"), eval_seed_range(cfg, 3, "validation")
    assert not set(test) & set(val) and max(val) < DEMO_SEED_BASE
    assert eval_seed_range(load_config("metaworld_reach_ppo", ["eval.split=validation"]), 3) == val
    cfg = load_config("metaworld_reach_ppo", ["eval.validation_seed=10010"])  # meets test seeds 10000..
    with pytest.raises(ValueError) as err:
        eval_seed_range(cfg, 3)
    assert str(err.value).count("\n") == 0 and "validation eval seeds 10010.." in str(err.value)
    assert "overlap the test eval seeds 10000..10059" in str(err.value)
    cfg = load_config("metaworld_reach_ppo", [f"eval.validation_seed={DEMO_SEED_BASE - 5}"])
    with pytest.raises(ValueError, match="validation eval seeds .* where no demo episode starts"):
        eval_seed_range(cfg, 3)


def _first_states(cfg: EnvConfig, seeds) -> np.ndarray:
    with make_env(cfg, len(seeds)) as env:
        return env.reset(np.asarray(seeds))["states"]


@pytest.mark.parametrize(
    "env",
    [
        EnvConfig(name="metaworld", task="reach-v3"),  # MetaWorld: goal and hand start in the state
        EnvConfig(name="bench", task="state_dim=6,action_dim=2"),  # the zero-cost bench env
        EnvConfig(name="gym:InvertedPendulum-v5"),  # gymnasium: the reset seed draws the start
    ],
    ids=["metaworld", "bench", "gym"],
)
def test_seed_keyed_envs_play_other_episodes_on_validation(env):
    """Seed-keyed envs (MetaWorld, gymnasium, the bench env, plugins): a split is its seed range,
    so validation episodes are other episodes than the test ones and the demos'."""

    if env.name.startswith("gym:"):
        pytest.importorskip("mujoco")

    cfg = load_config("metaworld_reach_ppo", ["eval.episodes_per_task=4"])
    test, val = eval_seed_range(cfg, 1, "test"), eval_seed_range(cfg, 1, "validation")
    demo = range(DEMO_SEED_BASE, DEMO_SEED_BASE + 4)
    states = {
        name: _first_states(build_env_config(env).held_out(split), list(seeds))
        for name, split, seeds in (("test", "test", test), ("validation", "validation", val), ("demo", "test", demo))
    }
    for row in states["validation"]:
        assert not any(np.allclose(row, other) for other in (*states["test"], *states["demo"]))
    # the same seeds replay the same episodes, so the splits differ by their seeds, not by chance
    np.testing.assert_array_equal(
        _first_states(build_env_config(env).held_out("validation"), list(val)), states["validation"]
    )


def test_calvin_validation_chains_are_held_out_and_not_the_test_ones(monkeypatch):
    from rlfleet.envs.calvin import chains

    val = [chains.pool_entry("validation", i) for i in range(60)]
    test = {chains.pool_entry("eval", i) for i in range(60)}
    assert all(chains.chain_split(c.subtasks) == "eval" for c in val)  # held-out chains: never trained on
    assert not set(val) & test and len(set(val)) == len(val)
    assert chains.pool_size("validation") == chains.EVAL_POOL_SIZE
    chains.check_pools_disjoint(range(10_000, 10_060), range(500_000, 500_060))  # what a run plays
    with monkeypatch.context() as m:  # an overlap (forced) is refused in one line
        m.setattr(chains, "pool_entry", lambda split, i: chains.ChainSpec(7, ("open_drawer",) * 5))
        with pytest.raises(ValueError, match=r"^CALVIN validation chain 500000 is also a test \(eval pool\) chain"):
            chains.check_pools_disjoint(range(10_000, 10_002), range(500_000, 500_002))


def test_calvin_env_reads_the_validation_pool():
    pytest.importorskip("pybullet")

    cfg = build_env_config(EnvConfig(name="calvin", task="D")).held_out("validation")
    assert cfg.pool == "validation"
    with make_env(cfg, 1) as env:
        env.reset(np.array([500_000]))
        from rlfleet.envs.calvin.chains import pool_entry

        assert env.current_chains() == [pool_entry("validation", 0)]


def test_robotwin_validation_seed_files_are_disjoint_and_played():
    pytest.importorskip("sapien")
    from rlfleet.envs.robotwin import seeds as rt_seeds
    from rlfleet.envs.robotwin.settings import SETTINGS
    from rlfleet.envs.robotwin.tasks import TASKS

    for task in TASKS:
        for setting in SETTINGS:
            rt_seeds.check_splits_disjoint(task, setting)
            val = set(rt_seeds.load_seeds(task, "validation", setting))
            assert val and min(val) >= rt_seeds.SPLIT_BASE["validation"]
            assert not val & set(rt_seeds.load_seeds(task, "eval", setting))
            assert not val & set(rt_seeds.load_seeds(task, "train", setting))
            assert val <= rt_seeds.held_out_seeds(task, setting)  # split `any` never plays them either
    cfg = build_env_config(EnvConfig(name="robotwin", task="click_bell:eval")).held_out("validation")
    with make_env(cfg, 2) as env:
        env.reset(np.array([500_000, 500_001]))
        played = env.episode_seeds
    assert set(played) <= set(rt_seeds.load_seeds("click_bell", "validation", "clean")) and len(set(played)) == 2


def test_robotwin_overlapping_seed_files_are_refused(monkeypatch):
    from rlfleet.envs.robotwin import seeds as rt_seeds

    files = {"train": {"clean": [1, 2]}, "eval": {"clean": [1_000_000]}, "validation": {"clean": [1_000_000]}}
    monkeypatch.setattr(rt_seeds, "_read", lambda task, split: files[split])
    with pytest.raises(ValueError, match=r"^RoboTwin click_bell:clean: seed 1000000 is in both the eval and"):
        rt_seeds.check_splits_disjoint("click_bell", "clean")


def test_the_start_check_asks_the_env(monkeypatch):
    """eval_seed_range hands the env its split ranges (ChunkedEnv.check_held_out_splits)."""
    import rlfleet.eval.splits as splits

    seen = []

    monkeypatch.setattr(splits, "check_held_out_splits", lambda cfg, t, v: seen.append((cfg.pool, t, v)))
    cfg = load_config("calvin_d_d_ppo_mlp_cpu", ["eval.episodes_per_task=2", "eval.periodic_episodes_per_task=0"])
    eval_seed_range(cfg, 2, "validation")
    assert seen == [("eval", range(10_000, 10_004), range(500_000, 500_004))]
