"""Advantage estimators by name: one registry, one result structure, the same numbers as the
formulas they wrap."""

import pytest
import torch

from rlfleet.algorithms import PPOConfig, compute_gae
from rlfleet.algorithms.estimators import (
    ESTIMATORS,
    AdvantageInputs,
    Advantages,
    advantage_stats,
    episode_schedule,
    estimate,
    estimator_name,
    register_estimator,
    spec,
)
from rlfleet.algorithms.grpo import grpo_segment
from rlfleet.algorithms.vtrace import vtrace

T, B = 6, 4


def _inputs(seed: int = 0) -> AdvantageInputs:
    g = torch.Generator().manual_seed(seed)
    terminated = torch.zeros(T, B, dtype=torch.bool)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    terminated[2, 0] = True
    truncated[T - 1, :] = True  # every column ends its episode: GRPO's whole-episode segments
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    next_values = torch.randn(T, B, generator=g, dtype=torch.float64)
    next_values[terminated] = 0.0
    return AdvantageInputs(
        rewards=torch.randn(T, B, generator=g, dtype=torch.float64),
        terminated=terminated,
        truncated=truncated,
        values=values,
        next_values=next_values,
        log_rhos=0.3 * torch.randn(T, B, generator=g, dtype=torch.float64),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )


def test_registry_names():
    assert sorted(ESTIMATORS) == ["gae", "grpo", "vtrace"]


def test_estimators_are_registered_with_their_traits():
    traits = {n: (s.critic, s.whole_episodes, s.normalised) for n, s in ESTIMATORS.items()}
    assert traits == {"gae": (True, False, False), "vtrace": (True, False, False), "grpo": (False, True, True)}
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope' .known: gae, grpo, vtrace"):
        spec("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("gae")(ESTIMATORS["gae"].fn)


def test_a_new_estimator_is_chosen_by_its_traits_not_its_name():
    """A critic-free whole-episode estimator registered here gets GRPO's treatment: no critic,
    its own normalisation, the whole-episode schedule, and the config checks that go with them."""
    from types import SimpleNamespace

    from rlfleet.algorithms.objective import objective

    @register_estimator("rloo_test", critic=False, whole_episodes=True, normalised=True)
    def rloo(inputs, cfg):
        return estimate("grpo", inputs, cfg)

    try:
        cfg = PPOConfig(adv_type="rloo_test", group_size=2)
        assert estimator_name(cfg) == "rloo_test"
        obj = objective(cfg)
        assert (obj.critic, obj.normalize_advantages, obj.whole_segment_advantages) == (False, False, True)
        env = SimpleNamespace(max_episode_steps=12, chunk_size=4, terminate_on_success=False)
        actor = SimpleNamespace(rollout_len=5, num_envs=4, pipeline_stage_num=1)
        assert episode_schedule(cfg, env, actor).segment_len == 3
        with pytest.raises(ValueError, match="critic_warmup_updates must be 0 with 'rloo_test'"):
            PPOConfig(adv_type="rloo_test", critic_warmup_updates=1)
        with pytest.raises(ValueError, match="off_policy=vtrace needs a critic"):
            PPOConfig(adv_type="rloo_test", off_policy="vtrace")
    finally:
        del ESTIMATORS["rloo_test"]


@pytest.mark.parametrize("name", ["gae", "vtrace", "grpo"])
def test_every_estimator_returns_the_one_structure(name):
    out = estimate(name, _inputs(), PPOConfig(gamma=0.9, gae_lambda=0.8))
    assert isinstance(out, Advantages)
    assert out.advantages.shape == out.returns.shape == out.keep.shape == (T, B)
    assert out.keep.dtype == torch.bool
    assert out.importance_in_advantage is (name == "vtrace")
    assert (out.group is not None) is (name == "grpo")


def test_gae_estimator_is_compute_gae():
    x, cfg = _inputs(1), PPOConfig(gamma=0.9, gae_lambda=0.8)
    out = estimate("gae", x, cfg)
    adv, ret = compute_gae(x.rewards, x.values, x.next_values, x.terminated | x.truncated, 0.9, 0.8)
    assert torch.equal(out.advantages, adv) and torch.equal(out.returns, ret) and bool(out.keep.all())


def test_vtrace_estimator_is_vtrace_and_on_policy_returns_equal_gae():
    x, cfg = (
        _inputs(2),
        PPOConfig(gamma=0.9, gae_lambda=0.8, rho_bar=1.5, vtrace_c_bar=1.2),
    )
    out = estimate("vtrace", x, cfg)
    vs, adv = vtrace(
        x.log_rhos,
        x.rewards,
        x.values,
        x.next_values,
        x.terminated | x.truncated,
        0.9,
        1.5,
        1.2,
        0.8,
    )
    assert torch.equal(out.returns, vs) and torch.equal(out.advantages, adv)
    x.log_rhos = torch.zeros(T, B, dtype=torch.float64)  # on-policy: the TD(lambda) return, as GAE's
    torch.testing.assert_close(estimate("vtrace", x, cfg).returns, estimate("gae", x, cfg).returns)


def test_grpo_estimator_is_grpo_segment():
    x, cfg = (
        _inputs(3),
        PPOConfig(adv_type="grpo", group_size=2, group_filter=[-100.0, 100.0]),
    )
    out = estimate("grpo", x, cfg)
    ref = grpo_segment(x.rewards, x.terminated, x.truncated, x.group_ids, [-100.0, 100.0])
    assert torch.equal(out.advantages, ref.advantages) and torch.equal(out.keep, ref.keep)
    assert torch.equal(out.returns, ref.returns.unsqueeze(0).expand(T, B))
    assert not bool(out.keep[3:, 0].any())  # after column 0's termination at step 2: not its episode


def test_estimator_name_from_config():
    assert estimator_name(PPOConfig()) == "gae"
    assert estimator_name(PPOConfig(off_policy="vtrace")) == "vtrace"
    assert estimator_name(PPOConfig(adv_type="grpo")) == "grpo"


def test_unknown_name_and_missing_inputs_are_one_line_errors():
    with pytest.raises(
        ValueError,
        match=r"unknown advantage estimator 'td0' \(known: gae, grpo, vtrace\)",
    ):
        estimate("td0", _inputs(), PPOConfig())
    x = _inputs()
    x.log_rhos = None
    with pytest.raises(ValueError, match="the vtrace estimator needs log_rhos"):
        estimate("vtrace", x, PPOConfig())
    x.group_ids = None
    with pytest.raises(ValueError, match="the grpo estimator needs group_ids"):
        estimate("grpo", x, PPOConfig(adv_type="grpo"))


def _columns_of(x: AdvantageInputs, cols: list[int]) -> AdvantageInputs:
    c = torch.tensor(cols)
    pick = lambda t: None if t is None else t[:, c]  # noqa: E731
    return AdvantageInputs(
        x.rewards[:, c], x.terminated[:, c], x.truncated[:, c], pick(x.values), pick(x.next_values), pick(x.log_rhos)
    )


@pytest.mark.parametrize("name", ["gae", "vtrace"])
def test_columns_of_a_critic_estimate_equal_the_estimate_on_those_columns(name):
    """GAE and V-trace run along time within each env column, so a DDP rank may estimate its own."""
    x, cfg, cols = _inputs(4), PPOConfig(gamma=0.9, gae_lambda=0.8), [3, 1]
    part, direct = estimate(name, x, cfg).columns(cols), estimate(name, _columns_of(x, cols), cfg)
    for field in ("advantages", "returns", "keep"):
        assert torch.equal(getattr(part, field), getattr(direct, field)), field
    assert part.importance_in_advantage is direct.importance_in_advantage


def test_columns_of_a_grpo_estimate_keep_the_whole_group_statistics():
    x, cfg = _inputs(5), PPOConfig(adv_type="grpo", group_size=2)
    whole = estimate("grpo", x, cfg)
    part = whole.columns([1, 2])
    assert torch.equal(part.advantages, whole.advantages[:, [1, 2]])
    assert torch.equal(part.returns, whole.returns[:, [1, 2]]) and torch.equal(part.keep, whole.keep[:, [1, 2]])
    assert part.group is not None and torch.equal(part.group.returns, whole.returns[0, [1, 2]])
    # column 1 alone is its group's one member on this shard: estimated here, its advantage would be 0
    assert bool((part.advantages[0] != 0).all())


def test_advantage_stats_are_grpo_only():
    x = _inputs(6)
    assert advantage_stats([estimate("gae", x, PPOConfig())], [x.group_ids]) == {}
    stats = advantage_stats([estimate("grpo", x, PPOConfig(adv_type="grpo"))], [x.group_ids])
    assert stats["train/grpo/groups"] == 2.0


def test_the_episode_schedule_is_the_estimators_not_the_roles():
    """Actors and learner ask `episode_schedule` what a segment is; only GRPO's asks whole episodes."""
    from types import SimpleNamespace as NS

    from rlfleet.algorithms.estimators import EpisodeSchedule, episode_schedule

    env = NS(max_episode_steps=150, chunk_size=4, terminate_on_success=False)  # 150 is no multiple of 4
    actor = NS(rollout_len=32, num_envs=8, pipeline_stage_num=2)
    for off_policy in ("", "vtrace"):
        ppo = NS(adv_type="gae", off_policy=off_policy, group_size=4)
        assert episode_schedule(ppo, env, actor) == EpisodeSchedule(32, 0)
    grpo = NS(adv_type="grpo", off_policy="", group_size=4)
    with pytest.raises(ValueError, match="multiple of env.chunk_size"):
        episode_schedule(grpo, env, actor)
    env.max_episode_steps = 160
    assert episode_schedule(grpo, env, actor) == EpisodeSchedule(40, 4)
    with pytest.raises(ValueError, match="terminate_on_success"):
        episode_schedule(grpo, NS(max_episode_steps=160, chunk_size=4, terminate_on_success=True), actor)
    with pytest.raises(ValueError, match="group_size"):
        episode_schedule(grpo, env, NS(rollout_len=32, num_envs=6, pipeline_stage_num=2))
