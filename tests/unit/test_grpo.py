"""GRPO through the fleet: group advantages against hand-computed numbers, the filter, the valid
mask, the learner's GRPO path (one process and sharded), the segment's group_ids on the wire,
and the actor's grouped seeded resets (with real MetaWorld env workers)."""

import math

import numpy as np
import pytest
import torch

from rlfleet.actors.groups import GroupedResets, group_seeds, stage_groups
from rlfleet.actors.rollout import SegmentBuilder
from rlfleet.algorithms import PPOConfig, policy_lag
from rlfleet.algorithms.grpo import (
    check_stage_rows,
    check_task_rows,
    episode_rollout_len,
    episode_valid_mask,
    grpo_segment,
    trajectory_returns,
)
from rlfleet.learner.sharding import shard_rows
from rlfleet.learner.trainer import Trainer
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire import codec
from rlfleet.wire.codec import WireFormatError
from rlfleet.wire.segment import Segment
from rlfleet.wire.shm import SharedArrays
from rlfleet.wire.slots import slot_layout

S, D, K = 5, 2, 1
SQ2 = math.sqrt(2.0)


# --- a hand-made whole-episode segment: T=4 steps, 9 envs in 3 groups of 3 ----------------------
#   group 5 (envs 0-2): env 0 succeeds at t=1 and terminates there (its t=2,3 rewards belong to the
#                       auto-reset's next episode and must not count); env 1 fails; env 2 succeeds
#                       at the last step.  Returns [1, 0, 1].
#   group 2 (envs 3-5): all succeed at t=1: returns [1, 1, 1]
#   group 9 (envs 6-8): all fail: returns [0, 0, 0]
T, B = 4, 9
GROUP_IDS = np.array([5, 5, 5, 2, 2, 2, 9, 9, 9], np.int64)


def hand_rewards_and_ends():
    r = np.zeros((T, B), np.float32)
    r[1, 0] = 1.0
    r[2:, 0] = 1.0  # after env 0's episode ended: excluded
    r[3, 2] = 1.0
    r[1, 3:6] = 1.0
    term = np.zeros((T, B), bool)
    trunc = np.zeros((T, B), bool)
    term[1, 0] = True
    term[3, 0] = True  # the leftover episode "ends" too: only the first end counts
    trunc[3, 1:] = True
    return r, term, trunc


def expected_advantages() -> np.ndarray:
    """By hand. Group 5 returns [1, 0, 1]: mean 2/3, population std sqrt(2/9) = sqrt(2)/3, so
    A = (1 - 2/3) / (sqrt(2)/3) = 1/sqrt(2) for envs 0 and 2, A = -(2/3) / (sqrt(2)/3) = -sqrt(2)
    for env 1. Groups 2 and 9 have std 0: A = 0. Env 0's steps 2 and 3 are not valid: 0."""
    A = np.zeros((T, B))
    A[:2, 0] = 1 / SQ2
    A[:, 1] = -SQ2
    A[:, 2] = 1 / SQ2
    return A


def test_valid_mask_and_returns_by_hand():
    r, term, trunc = hand_rewards_and_ends()
    valid = episode_valid_mask(torch.from_numpy(term), torch.from_numpy(trunc))
    want = np.ones((T, B), bool)
    want[2:, 0] = False
    np.testing.assert_array_equal(valid.numpy(), want)
    R = trajectory_returns(torch.from_numpy(r), valid)
    np.testing.assert_array_equal(R.numpy(), [1, 0, 1, 1, 1, 1, 0, 0, 0])


def test_group_advantages_by_hand_spread_over_valid_steps_only():
    r, term, trunc = hand_rewards_and_ends()
    out = grpo_segment(
        torch.from_numpy(r), torch.from_numpy(term), torch.from_numpy(trunc), torch.from_numpy(GROUP_IDS)
    )
    np.testing.assert_allclose(
        out.traj_advantages.numpy(), [1 / SQ2, -SQ2, 1 / SQ2, 0, 0, 0, 0, 0, 0], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(out.advantages.numpy(), expected_advantages(), rtol=1e-5, atol=1e-6)
    # no filter: every valid step is trained on
    assert out.keep.sum().item() == T * B - 2 and not out.keep[2:, 0].any()


def test_filter_drops_all_success_and_all_fail_groups():
    r, term, trunc = hand_rewards_and_ends()
    out = grpo_segment(
        torch.from_numpy(r),
        torch.from_numpy(term),
        torch.from_numpy(trunc),
        torch.from_numpy(GROUP_IDS),
        group_filter=(0.1, 0.9),
    )
    np.testing.assert_array_equal(out.group_kept.numpy(), [True] * 3 + [False] * 6)
    keep = np.zeros((T, B), bool)
    keep[:2, 0] = True
    keep[:, 1:3] = True
    np.testing.assert_array_equal(out.keep.numpy(), keep)
    # inclusive bounds: [0, 1] keeps everything
    wide = grpo_segment(
        torch.from_numpy(r),
        torch.from_numpy(term),
        torch.from_numpy(trunc),
        torch.from_numpy(GROUP_IDS),
        group_filter=(0.0, 1.0),
    )
    assert bool(wide.group_kept.all())


def test_segment_must_hold_whole_episodes():
    r, term, trunc = hand_rewards_and_ends()
    trunc[3, 4] = False  # env 4 never ends its episode
    with pytest.raises(ValueError, match=r"env columns \[4\] did not end"):
        grpo_segment(torch.from_numpy(r), torch.from_numpy(term), torch.from_numpy(trunc), torch.from_numpy(GROUP_IDS))


# --- the learner's GRPO path ---------------------------------------------------------------------


def make_policy(seed: int = 0) -> GaussianMLPPolicy:
    torch.manual_seed(seed)
    return GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[16, 16]))


def hand_segment(policy, versions, seed: int = 0) -> Segment:
    r, term, trunc = hand_rewards_and_ends()
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(T, B, S)).astype(np.float32)
    with torch.no_grad():
        out = policy.act({"states": torch.from_numpy(states.reshape(T * B, S))})
    return Segment(
        obs={"states": states},
        actions=out["actions"].numpy().reshape(T, B, K, D),
        logprobs=out["logprobs"].numpy().reshape(T, B),
        values=out["values"].numpy().reshape(T, B),
        rewards=r,
        terminated=term,
        truncated=trunc,
        final_obs={"states": np.where((term | trunc)[..., None], states, 0).astype(np.float32)},
        next_obs={"states": rng.normal(size=(B, S)).astype(np.float32)},
        versions=np.asarray(versions, np.int64),
        task_ids=np.zeros(B, np.int64),
        env_steps=np.array(T * B * K, np.int64),
        ep_returns=np.zeros(0, np.float32),
        ep_lengths=np.zeros(0, np.int32),
        ep_success=np.zeros(0, bool),
        ep_task_ids=np.zeros(0, np.int64),
        extras={},
        group_ids=GROUP_IDS.copy(),
    )


def grpo_cfg(**kw) -> PPOConfig:
    base = dict(
        adv_type="grpo",
        group_size=3,
        group_filter=[0.1, 0.9],
        update_epochs=2,
        num_minibatches=2,
        lr=1e-2,
        max_policy_lag=1,
    )
    base.update(kw)
    return PPOConfig(**base)


def kept(batch):
    """The rows a prepared batch trains on."""
    return batch.select(batch.valid.nonzero().squeeze(-1))


def test_learner_prepares_group_advantages_on_kept_rows():
    policy = make_policy()
    trainer = Trainer(policy, grpo_cfg())
    seg = hand_segment(policy, versions=[3, 3, 3, 3])
    batch = trainer.prepare([seg], version=3)
    keep = np.zeros((T, B), bool)
    keep[:2, 0] = True
    keep[:, 1:3] = True
    assert len(batch) == T * B  # fixed shape: the estimator's left-out rows are masked
    np.testing.assert_array_equal(batch.valid.numpy(), keep.reshape(-1))
    batch = kept(batch)
    assert len(batch) == keep.sum() == 10
    # rows in step-major order: the kept (t, b) with their hand-computed advantage
    np.testing.assert_allclose(batch.advantages.numpy(), expected_advantages()[keep], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(batch.returns.numpy(), np.array([[1, 0, 1]] * T, np.float32)[keep[:, :3]])
    torch.testing.assert_close(batch.obs["states"], torch.from_numpy(seg.obs["states"][keep]))
    # reward_scale multiplies the returns; advantages are scale-free (up to eps)
    scaled = kept(Trainer(policy, grpo_cfg(group_filter=[0.5, 4.5]), reward_scale=5.0).prepare([seg], version=3))
    assert len(scaled) == 10
    np.testing.assert_allclose(scaled.advantages.numpy(), batch.advantages.numpy(), rtol=1e-5)


def test_learner_grpo_drops_stale_steps_too():
    policy = make_policy()
    trainer = Trainer(policy, grpo_cfg())
    seg = hand_segment(policy, versions=[1, 2, 3, 3])  # at version 3: lags 2, 1, 0, 0 -> step 0 dropped
    batch = kept(trainer.prepare([seg], version=3))
    keep = np.zeros((T, B), bool)
    keep[1, 0] = True
    keep[1:, 1:3] = True
    assert len(batch) == keep.sum()
    np.testing.assert_allclose(batch.advantages.numpy(), expected_advantages()[keep], rtol=1e-5, atol=1e-6)


def test_grpo_update_trains_the_actor_not_the_critic_and_logs_group_metrics():
    policy = make_policy()
    trainer = Trainer(policy, grpo_cfg())
    segs = [hand_segment(policy, [3] * T, seed=i) for i in range(2)]
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    metrics = trainer.step(segs, version=3)
    after = dict(policy.named_parameters())
    assert not torch.equal(before["actor.0.weight"], after["actor.0.weight"])
    for name in before:
        if name.startswith("critic"):
            assert torch.equal(before[name], after[name]), name  # the value head is never trained
    assert not any(k.startswith("train/critic/") for k in metrics)
    assert metrics["train/grpo/groups"] == 6 and metrics["train/grpo/filtered_groups"] == 4
    assert metrics["train/grpo/zero_std_groups"] == 4
    assert metrics["train/samples"] == 20 and metrics["train/dropped_samples"] == 2 * T * B - 20
    assert metrics["train/grpo/trajectory_return_mean"] == pytest.approx(5 / 9)
    assert metrics["train/grpo/advantage_abs_max"] == pytest.approx(SQ2, rel=1e-5)
    assert metrics["train/grpo/valid_step_fraction"] == pytest.approx((T * B - 2) / (T * B))
    assert math.isfinite(metrics["train/actor/policy_loss"]) and metrics["train/actor/grad_norm"] > 0
    assert metrics["throughput/policy_lag_count/0"] == 2 * T * B


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_grpo_rows_equal_the_one_process_rows(world_size):
    """Columns go to ranks round-robin, so every group is split across ranks: the group statistics
    must still come from the whole segment, and the shards must partition the one-process rows."""
    policy = make_policy()
    trainer = Trainer(policy, grpo_cfg())
    segs = [hand_segment(policy, [2, 3, 3, 3], seed=i) for i in range(2)]
    full = trainer.prepare(segs, version=3)
    grpo = trainer.segment_advantages(segs)
    lags = [policy_lag(3, torch.from_numpy(s.versions)) for s in segs]
    valid = trainer.valid_rows(segs, lags, grpo)
    assert torch.equal(valid, full.valid)
    seen = torch.zeros(len(full), dtype=torch.long)
    for rank in range(world_size):
        shard = shard_rows(segs, valid, rank, world_size)
        assert shard.num_rows == int(full.valid.sum())
        batch = trainer._prepare(segs, lags, grpo, shard)
        ids = shard.row_ids
        torch.testing.assert_close(batch.advantages, full.advantages[ids])
        torch.testing.assert_close(batch.obs["states"], full.obs["states"][ids])
        assert torch.equal(batch.valid, full.valid[ids])
        seen[ids] += 1
    assert torch.equal(seen, torch.ones_like(seen))


def test_grpo_config_validation():
    with pytest.raises(ValueError, match="adv_type"):
        PPOConfig(adv_type="ppo")
    with pytest.raises(ValueError, match="vtrace needs a critic"):
        PPOConfig(adv_type="grpo", off_policy="vtrace")
    with pytest.raises(ValueError, match="group_filter"):
        PPOConfig(adv_type="grpo", group_filter=[0.9, 0.1])
    with pytest.raises(ValueError, match="no critic"):
        PPOConfig(adv_type="grpo", critic_warmup_updates=2)


# --- group_ids on the wire -----------------------------------------------------------------------


def test_group_ids_round_trip_and_old_segments_still_decode():
    policy = make_policy()
    seg = hand_segment(policy, [0] * T)
    back = Segment.from_tensors(codec.decode_map(codec.encode_map(seg.to_tensors())))
    np.testing.assert_array_equal(back.group_ids, GROUP_IDS)
    old = {k: v for k, v in seg.to_tensors().items() if k != "group_ids"}  # a segment from before the field
    decoded = Segment.from_tensors(old)
    assert decoded.group_ids.shape == (0,)
    assert "group_ids" not in decoded.to_tensors()  # GAE segments look exactly as before on the wire
    bad = dict(seg.to_tensors(), group_ids=np.zeros(B + 1, np.int64))
    with pytest.raises(WireFormatError, match="group_ids"):
        Segment.from_tensors(bad)


def test_schema_check_needs_whole_groups_and_episodes():
    policy = make_policy()
    spec = {"states": ((S,), "float32")}
    seg = hand_segment(policy, [0] * T)
    seg.check_schema(spec, D, K, (), {}, group_size=3)
    seg.check_schema(spec, D, K, (), {})  # a GAE run ignores the groups
    with pytest.raises(WireFormatError, match="groups must have 4 envs") as err:
        seg.check_schema(spec, D, K, (), {}, group_size=4)
    assert err.value.reason == "grpo_groups"
    no_groups = Segment.from_tensors({k: v for k, v in seg.to_tensors().items() if k != "group_ids"})
    with pytest.raises(WireFormatError, match="needs group_ids"):
        no_groups.check_schema(spec, D, K, (), {}, group_size=3)
    seg.truncated[3, 4] = False
    with pytest.raises(WireFormatError, match="whole episodes"):
        seg.check_schema(spec, D, K, (), {}, group_size=3)


# --- the actor side ------------------------------------------------------------------------------


def test_episode_rollout_len_and_stage_rows():
    assert episode_rollout_len(160, 8) == 20
    with pytest.raises(ValueError, match="multiple of env.chunk_size"):
        episode_rollout_len(150, 8)
    with pytest.raises(ValueError, match="terminate_on_success=false"):
        episode_rollout_len(160, 8, terminate_on_success=True)
    check_stage_rows(32, 2, 8)
    with pytest.raises(ValueError, match="must not span pipeline stages"):
        check_stage_rows(24, 2, 8)


def test_stage_groups_follow_tasks():
    # MetaWorld cycles 2 tasks over the rows: groups of 2 must pair rows of one task
    g = stage_groups(np.array([0, 1, 0, 1, 0, 1, 0, 1]), 2)
    np.testing.assert_array_equal(g.group_ids, [0, 2, 0, 2, 1, 3, 1, 3])
    assert g.num_groups == 4
    with pytest.raises(ValueError, match="task id 0 has 3 envs in stage 1"):
        stage_groups(np.array([0, 1, 0, 1, 1, 0]), 2, stage=1)
    check_task_rows([7, 7, 9, 9, 7, 7], 2)  # the check lives with GRPO; the actor's grouping calls it
    with pytest.raises(ValueError, match=r"task id 9 has 1 envs in stage 0.*\(2 x 2\)"):
        check_task_rows([7, 7, 9], 2)


def test_group_seeds_distinct_and_reproducible():
    a = group_seeds(0, 0, 0, 0, 4)
    assert len(set(a.tolist())) == 4 and (a >= 0).all()
    np.testing.assert_array_equal(a, group_seeds(0, 0, 0, 0, 4))
    others = [
        group_seeds(1, 0, 0, 0, 4),
        group_seeds(0, 1, 0, 0, 4),
        group_seeds(0, 0, 1, 0, 4),
        group_seeds(0, 0, 0, 1, 4),
    ]
    every = np.concatenate([a, *others])
    assert len(set(every.tolist())) == len(every)


def test_grouped_resets_give_group_members_one_seed():
    resets = GroupedResets([(0, 4), (4, 8)], np.array([0, 1, 0, 1, 0, 1, 0, 1]), 2, base_seed=7, actor_index=3)
    first = resets.all_seeds()
    assert first[0] == first[2] and first[1] == first[3] and first[0] != first[1]
    assert len({first[0], first[1], first[4], first[5]}) == 4  # stages get their own groups
    nxt = np.zeros(8, np.int64)
    resets.next_seeds(0, nxt)
    assert nxt[0] == nxt[2] and nxt[0] not in first  # a new round, new seeds
    assert (nxt[4:] == 0).all()  # only stage 0's rows are written


def test_builder_in_group_mode_reports_each_env_first_episode_only():
    E = 2
    layout = slot_layout(E, {"states": ((S,), "float32")}, D, K)
    slots = SharedArrays.create(layout)
    try:
        builder = SegmentBuilder(3, 0, E, layout, group_ids=np.array([0, 0]))
        slots["task_ids"][:] = 0
        for t in range(3):
            builder.record_policy(slots, version=0)
            done = np.array([t >= 1, t == 2])  # env 0 ends at t=1, then again at t=2 (leftover episode)
            slots["episode_done"][:] = done
            slots["terminated"][:] = done
            slots["episode_return"][:] = [10.0 + t, 20.0]
            slots["episode_length"][:] = t + 1
            builder.record_step(slots)
        seg = builder.finish(slots)
    finally:
        slots.close()
    np.testing.assert_array_equal(seg.ep_returns, [11.0, 20.0])  # env 0's t=2 end is not an episode
    np.testing.assert_array_equal(seg.group_ids, [0, 0])
    assert builder.in_episode.all()  # the next segment starts fresh


def test_env_workers_reset_groups_to_identical_states():
    """Real MetaWorld workers: a group's envs start identically; another group does not; the stage's
    last step (step_reset) resets them again to new, grouped states."""
    from rlfleet.actors.env_worker import EnvWorkerPool
    from rlfleet.envs.api import EnvConfig, observation_spec

    env_cfg = EnvConfig(task="reach-v3", max_episode_steps=4, chunk_size=2)
    layout = slot_layout(4, observation_spec(env_cfg, 39), 4, 2)
    pool = EnvWorkerPool(env_cfg.__dict__, 4, 1, 1, layout)
    try:
        pool.reset()
        resets = GroupedResets(pool.stage_rows, np.array(pool.slots["task_ids"]), 2, base_seed=0, actor_index=0)
        pool.reset(resets.all_seeds())
        s0 = np.array(pool.slots["states"])
        np.testing.assert_array_equal(s0[0], s0[1])
        np.testing.assert_array_equal(s0[2], s0[3])
        assert np.abs(s0[0] - s0[2]).max() > 1e-3
        pool.slots["actions"][:] = np.random.default_rng(0).uniform(-1, 1, size=(4, 2, 4))
        pool.step_async(0)
        pool.step_wait(0)
        assert np.abs(np.array(pool.slots["states"])[0] - s0[0]).max() > 0  # the envs moved
        seeds = np.zeros(4, np.int64)
        resets.next_seeds(0, seeds)
        pool.step_async(0, reset_seeds=seeds)  # the episode's last step, then a grouped reset
        pool.step_wait(0)
        assert pool.slots["truncated"].all()  # 4 env steps = max_episode_steps
        s1 = np.array(pool.slots["states"])
        np.testing.assert_array_equal(s1[0], s1[1])
        np.testing.assert_array_equal(s1[2], s1[3])
        assert np.abs(s1[0] - s0[0]).max() > 1e-3 and np.abs(s1[0] - s1[2]).max() > 1e-3
    finally:
        pool.close()


def test_grpo_learns_a_contextual_bandit():
    """Groups of G one-step episodes from the same state, reward -|a - target(s)|^2: with only
    group-relative advantages (no critic) the deterministic action must move to the target."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    W = (rng.normal(size=(D, S)) * 0.5).astype(np.float32)
    policy = make_policy()
    trainer = Trainer(
        policy, PPOConfig(adv_type="grpo", group_size=8, lr=3e-3, update_epochs=4, num_minibatches=4, max_policy_lag=0)
    )
    eval_states = rng.normal(size=(256, S)).astype(np.float32)

    def error() -> float:
        with torch.no_grad():
            a = policy.act({"states": torch.from_numpy(eval_states)}, deterministic=True)["actions"].numpy()[:, 0]
        return float(((a - np.tanh(eval_states @ W.T)) ** 2).sum(-1).mean())

    start = error()
    G, n_groups = 8, 32
    for version in range(15):
        s = np.repeat(rng.normal(size=(n_groups, S)).astype(np.float32), G, axis=0)  # G envs per start state
        with torch.no_grad():
            out = policy.act({"states": torch.from_numpy(s)})
        a = out["actions"].numpy()
        r = -((a[:, 0] - np.tanh(s @ W.T)) ** 2).sum(-1)
        N = len(s)
        seg = Segment(
            obs={"states": s[None]},
            actions=a[None],
            logprobs=out["logprobs"].numpy()[None],
            values=out["values"].numpy()[None],
            rewards=r[None].astype(np.float32),
            terminated=np.ones((1, N), bool),
            truncated=np.zeros((1, N), bool),
            final_obs={"states": s[None].copy()},
            next_obs={"states": s.copy()},
            versions=np.array([version], np.int64),
            task_ids=np.zeros(N, np.int64),
            env_steps=np.array(N, np.int64),
            ep_returns=r.astype(np.float32),
            ep_lengths=np.ones(N, np.int32),
            ep_success=np.zeros(N, bool),
            ep_task_ids=np.zeros(N, np.int64),
            extras={},
            group_ids=np.repeat(np.arange(n_groups), G),
        )
        trainer.step([seg], version)
    assert start > 0.2
    assert error() < 0.25 * start


@pytest.mark.parametrize("name,logprob_type", [("tiny_oft", "token"), ("tiny_pi0", "chunk")])
def test_grpo_update_with_vla_policies(name, logprob_type):
    """Per-token log-probs (tiny_oft) and flow extras (tiny_pi0's noise) through the GRPO path."""
    from rlfleet.envs.api import encode_instructions
    from rlfleet.policies.vla import TinyOFTPolicy, TinyPi0Policy, VLAConfig

    cls = {"tiny_oft": TinyOFTPolicy, "tiny_pi0": TinyPi0Policy}[name]
    torch.manual_seed(0)
    img, state_dim, chunk, act_dim = 16, 39, 2, 4
    policy = cls(
        state_dim, act_dim, chunk, VLAConfig(name=name, dim=32, depth=1, flow_hidden=32, logprob_type=logprob_type), img
    )
    rng = np.random.default_rng(0)
    obs = {
        "main_images": rng.integers(0, 256, size=(T, B, img, img, 3), dtype=np.uint8),
        "states": rng.normal(size=(T, B, state_dim)).astype(np.float32),
        "instructions": np.broadcast_to(encode_instructions(["open the drawer"] * B), (T, B, 128)).copy(),
    }
    with torch.no_grad():
        out = policy.act({k: torch.from_numpy(v.reshape(T * B, *v.shape[2:])) for k, v in obs.items()})
    r, term, trunc = hand_rewards_and_ends()
    seg = Segment(
        obs=obs,
        actions=out["actions"].numpy().reshape(T, B, chunk, act_dim),
        logprobs=out["logprobs"].numpy().reshape(T, B, *policy.logprob_shape),
        values=out["values"].numpy().reshape(T, B),
        rewards=r,
        terminated=term,
        truncated=trunc,
        final_obs={k: np.zeros_like(v) for k, v in obs.items()},
        next_obs={k: v[0] for k, v in obs.items()},
        versions=np.zeros(T, np.int64),
        task_ids=np.zeros(B, np.int64),
        env_steps=np.array(T * B * chunk, np.int64),
        ep_returns=np.zeros(0, np.float32),
        ep_lengths=np.zeros(0, np.int32),
        ep_success=np.zeros(0, bool),
        ep_task_ids=np.zeros(0, np.int64),
        extras={k: out[k].numpy().reshape(T, B, *out[k].shape[1:]) for k in policy.extra_outputs},
        group_ids=GROUP_IDS.copy(),
    )
    trainer = Trainer(policy, grpo_cfg(lr=1e-3))
    critic_before = {k: v.detach().clone() for k, v in policy.named_parameters() if k.startswith("critic")}
    actor_before = torch.cat([p.detach().flatten() for k, p in policy.named_parameters() if not k.startswith("critic")])
    metrics = trainer.step([seg], version=0)
    assert metrics["train/samples"] == 10 and metrics["train/grpo/filtered_groups"] == 2
    assert critic_before and all(torch.equal(v, dict(policy.named_parameters())[k]) for k, v in critic_before.items())
    actor_after = torch.cat([p.detach().flatten() for k, p in policy.named_parameters() if not k.startswith("critic")])
    assert not torch.equal(actor_before, actor_after)
    assert math.isfinite(metrics["train/actor/policy_loss"])


def test_a_resumed_stream_draws_other_group_seeds():
    """Rounds count from 0 again in a resumed run: its stream word keeps them off the first life's seeds."""
    fresh = group_seeds(0, 0, 0, 0, 4)
    np.testing.assert_array_equal(fresh, group_seeds(0, 0, 0, 0, 4, stream=0))  # fresh runs unchanged
    resumed = group_seeds(0, 0, 0, 0, 4, stream=5000)
    assert not set(resumed.tolist()) & set(fresh.tolist())
    np.testing.assert_array_equal(resumed, group_seeds(0, 0, 0, 0, 4, stream=5000))
