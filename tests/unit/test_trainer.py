import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from mlp_segments import make_segment

from rlfleet.algorithms import PPOConfig
from rlfleet.learner.trainer import Trainer
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire.segment import Segment

S, D, K = 5, 2, 1

EXPECTED_KEYS = {
    "train/actor/policy_loss",
    "train/actor/approx_kl",
    "train/actor/clip_fraction",
    "train/actor/grad_norm",
    "train/actor/entropy",
    "train/critic/value_loss",
    "train/critic/value_clip_ratio",
    "train/critic/explained_variance",
    "throughput/policy_lag",
}


def make_policy(seed: int = 0, hidden=(32, 32)) -> GaussianMLPPolicy:
    torch.manual_seed(seed)
    return GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=list(hidden)))


def params_of(policy):
    return {k: v.detach().clone() for k, v in policy.named_parameters()}


def test_update_returns_finite_metrics_and_changes_parameters():
    policy = make_policy(0)
    trainer = Trainer(policy, PPOConfig(update_epochs=2, num_minibatches=2, lr=1e-3))
    term = np.zeros((8, 4), bool)
    term[3, 1] = True
    trunc = np.zeros((8, 4), bool)
    trunc[5, 2] = True
    segs = [make_segment(policy, 8, 4, [3] * 8, seed=i, terminated=term, truncated=trunc) for i in range(2)]
    before = params_of(policy)

    metrics = trainer.step(segs, version=3)

    assert EXPECTED_KEYS <= set(metrics)
    for key in EXPECTED_KEYS:
        assert math.isfinite(metrics[key]), (key, metrics[key])
    assert metrics["train/actor/grad_norm"] > 0
    assert metrics["train/critic/value_loss"] > 0
    assert 0.0 <= metrics["train/actor/clip_fraction"] <= 1.0
    assert metrics["throughput/policy_lag"] == 0.0
    assert metrics["train/samples"] == 64.0 and metrics["train/dropped_samples"] == 0.0
    assert metrics["rollout/is_weight_mean"] == 1.0  # all on-policy
    after = params_of(policy)
    for name in ("actor.0.weight", "critic.0.weight", "critic.2.weight", "log_std"):
        assert not torch.equal(before[name], after[name]), name


def test_samples_older_than_max_policy_lag_are_masked():
    policy = make_policy(0)
    trainer = Trainer(policy, PPOConfig(max_policy_lag=4, update_epochs=1, num_minibatches=1))
    T, B = 8, 4
    seg = make_segment(policy, T, B, versions=np.arange(2, 10))  # lags 8..1 at learner version 10

    batch = trainer.prepare([seg], version=10)
    assert len(batch) == T * B  # fixed shape: every row, the old ones masked
    assert batch.lags.tolist() == [lag for lag in range(8, 0, -1) for _ in range(B)]
    assert batch.valid.tolist() == [False] * (4 * B) + [True] * (4 * B)
    torch.testing.assert_close(batch.obs["states"], torch.from_numpy(seg.obs["states"].reshape(-1, S)))

    metrics = trainer.step([seg], version=10)
    assert metrics["train/dropped_samples"] == 16.0
    assert metrics["train/samples"] == 16.0
    # lag is reported over everything received, the dropped samples included
    assert metrics["throughput/policy_lag"] == pytest.approx(4.5)
    assert metrics["throughput/policy_lag_max"] == 8.0


def test_all_samples_too_old_means_no_update():
    policy = make_policy(0)
    trainer = Trainer(policy, PPOConfig(max_policy_lag=1))
    seg = make_segment(policy, 4, 3, versions=[0, 0, 1, 1])
    before = params_of(policy)
    metrics = trainer.step([seg], version=5)
    assert {k: v for k, v in metrics.items() if not k.startswith("throughput/policy_lag_count/")} == {
        "train/dropped_samples": 12.0,
        "throughput/policy_lag": 4.5,
        "throughput/policy_lag_max": 5.0,
    }
    # per-lag sample counts: every lag up to max_policy_lag (zeros too), plus the larger ones seen
    assert {k: v for k, v in metrics.items() if k.startswith("throughput/policy_lag_count/")} == {
        "throughput/policy_lag_count/0": 0.0,
        "throughput/policy_lag_count/1": 0.0,
        "throughput/policy_lag_count/4": 6.0,
        "throughput/policy_lag_count/5": 6.0,
    }
    for name, value in params_of(policy).items():
        assert torch.equal(before[name], value), name


def test_newer_than_learner_samples_raise():
    policy = make_policy(0)
    trainer = Trainer(policy, PPOConfig())
    with pytest.raises(ValueError, match="newer than learner_version"):
        trainer.prepare([make_segment(policy, 2, 2, versions=[3, 4])], version=3)


def test_lag_zero_samples_have_importance_weight_exactly_one():
    policy = make_policy(0)
    trainer = Trainer(policy, PPOConfig(max_policy_lag=4, rho_bar=1.2))
    T, B = 4, 3
    # versions 9, 9, 8, 7 at learner version 9: lags 0, 0, 1, 2
    versions = [9, 9, 8, 7]
    up = make_segment(policy, T, B, versions, seed=1, logp_shift=-0.3)  # mu below pi_old
    down = make_segment(policy, T, B, versions, seed=2, logp_shift=+0.3)  # mu above pi_old

    batch = trainer.prepare([up, down], version=9)
    assert len(batch) == 2 * T * B
    lag0 = batch.lags == 0
    assert int(lag0.sum()) == 2 * 2 * B
    # lag 0: the behaviour log-prob *is* pi_old, whatever the learner would compute: weight 1 exactly
    assert torch.equal(batch.is_weights[lag0], torch.ones(int(lag0.sum())))
    behaviour = torch.cat([torch.from_numpy(up.logprobs.reshape(-1)), torch.from_numpy(down.logprobs.reshape(-1))])
    assert torch.equal(batch.logp_old[lag0], behaviour[lag0])
    # lagged: min(pi_old / mu, rho_bar) with pi_old = the learner's log-prob
    lagged_up = (batch.lags > 0) & (torch.arange(len(batch)) < T * B)
    lagged_down = (batch.lags > 0) & (torch.arange(len(batch)) >= T * B)
    torch.testing.assert_close(batch.is_weights[lagged_up], torch.full((2 * B,), 1.2))  # exp(0.3) capped
    torch.testing.assert_close(
        batch.is_weights[lagged_down], torch.full((2 * B,), math.exp(-0.3)), rtol=1e-5, atol=1e-5
    )


def test_only_lagged_rows_run_the_pre_update_policy():
    """Lag-0 rows keep the server's log-probs and values (the same weights computed them); lagged
    rows get the learner's own, from one forward pass over those rows alone."""
    policy = make_policy(0)
    trainer = Trainer(policy, PPOConfig(max_policy_lag=4))
    T, B = 4, 3
    seg = make_segment(policy, T, B, [9, 9, 8, 7], seed=1)
    seg.values = seg.values + 5.0  # told apart from the learner's own values below
    rows_seen = []
    evaluate = policy.evaluate

    def counting(obs, actions, extras):
        rows_seen.append(actions.shape[0])
        return evaluate(obs, actions, extras)

    policy.evaluate = counting
    batch = trainer.prepare([seg], version=9)
    assert rows_seen == [2 * B]  # the two lagged time steps only
    lag0 = batch.lags == 0
    served = torch.from_numpy(seg.values.reshape(-1))
    assert torch.equal(batch.values_old[lag0], served[lag0])
    with torch.no_grad():
        own = evaluate({"states": torch.from_numpy(seg.obs["states"].reshape(T * B, S))}, batch.actions, {})[2]
    torch.testing.assert_close(batch.values_old[~lag0], own[~lag0])


def _tiny_truncation_case():
    """T=3, B=2: env 0 is truncated after step 1, env 1 terminates after step 1."""
    policy = make_policy(3, hidden=(8,))
    terminated = np.array([[False, False], [False, True], [False, False]])
    truncated = np.array([[False, False], [True, False], [False, False]])
    seg = make_segment(policy, 3, 2, [0, 0, 0], seed=5, terminated=terminated, truncated=truncated)
    seg.rewards = np.array([[1.0, 2.0], [-1.0, 0.5], [0.25, 3.0]], np.float32)
    return policy, seg


def test_truncated_step_bootstraps_from_final_state_value():
    policy, seg = _tiny_truncation_case()
    gamma, scale = 0.9, 0.5
    trainer = Trainer(policy, PPOConfig(gamma=gamma, gae_lambda=1.0), reward_scale=scale)
    batch = trainer.prepare([seg], version=0)

    with torch.no_grad():
        V = policy.value({"states": torch.from_numpy(seg.obs["states"])}).double().numpy()  # [T, B]
        v_final_trunc = float(policy.value({"states": torch.from_numpy(seg.final_obs["states"][1, 0])}))
        v_next = policy.value({"states": torch.from_numpy(seg.next_obs["states"])}).double().numpy()  # [B]
    r = seg.rewards.astype(np.float64) * scale
    ret = np.zeros((3, 2))
    # env 0: truncated after t=1 -> bootstrap from V(final state); t=2 starts a new episode
    ret[2, 0] = r[2, 0] + gamma * v_next[0]
    ret[1, 0] = r[1, 0] + gamma * v_final_trunc
    ret[0, 0] = r[0, 0] + gamma * ret[1, 0]
    # env 1: terminated after t=1 -> no bootstrap at all
    ret[2, 1] = r[2, 1] + gamma * v_next[1]
    ret[1, 1] = r[1, 1]
    ret[0, 1] = r[0, 1] + gamma * r[1, 1]

    np.testing.assert_allclose(batch.returns.numpy(), ret.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.advantages.numpy(), (ret - V).reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.values_old.numpy(), V.reshape(-1), rtol=1e-6, atol=1e-6)


def test_no_bootstrap_at_time_limit_when_the_limit_is_part_of_the_task():
    """bootstrap_truncated=False: a truncated episode ends like a terminated one (its final state is
    worth 0), the following episode still bootstraps from next_obs."""
    policy, seg = _tiny_truncation_case()
    gamma, scale = 0.9, 0.5
    trainer = Trainer(policy, PPOConfig(gamma=gamma, gae_lambda=1.0, bootstrap_truncated=False), reward_scale=scale)
    batch = trainer.prepare([seg], version=0)

    with torch.no_grad():
        v_next = policy.value({"states": torch.from_numpy(seg.next_obs["states"])}).double().numpy()
    r = seg.rewards.astype(np.float64) * scale
    ret = np.zeros((3, 2))
    for b in range(2):  # both envs: the episode ends after t=1 with nothing after it
        ret[2, b] = r[2, b] + gamma * v_next[b]
        ret[1, b] = r[1, b]
        ret[0, b] = r[0, b] + gamma * r[1, b]
    np.testing.assert_allclose(batch.returns.numpy(), ret.reshape(-1), rtol=1e-5, atol=1e-5)

    seg.final_obs["states"][1, 0] += 5.0  # the truncated step's final state is no longer read
    assert torch.equal(trainer.prepare([seg], version=0).returns, batch.returns)


def test_final_states_matter_only_for_truncated_steps():
    policy, seg = _tiny_truncation_case()
    trainer = Trainer(policy, PPOConfig(gamma=0.9, gae_lambda=0.95))
    base = trainer.prepare([seg], version=0).advantages.reshape(3, 2)

    seg.final_obs["states"][1, 1] += 5.0  # the terminated step's final state: must be ignored
    same = trainer.prepare([seg], version=0).advantages.reshape(3, 2)
    assert torch.equal(same, base)

    seg.final_obs["states"][1, 0] += 5.0  # the truncated step's final state: bootstraps steps 0 and 1 of env 0
    changed = trainer.prepare([seg], version=0).advantages.reshape(3, 2)
    assert (changed[:2, 0] - base[:2, 0]).abs().min() > 1e-4
    assert torch.equal(changed[2, 0], base[2, 0])
    assert torch.equal(changed[:, 1], base[:, 1])


def test_ppo_learns_a_contextual_bandit():
    """1-step episodes, reward = -|a - target(s)|^2: the deterministic action must move to the target."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    W = (rng.normal(size=(D, S)) * 0.5).astype(np.float32)

    def target(states):
        return np.tanh(states @ W.T)

    policy = make_policy(0)
    trainer = Trainer(policy, PPOConfig(lr=3e-3, update_epochs=4, num_minibatches=4, max_policy_lag=0))
    eval_states = rng.normal(size=(512, S)).astype(np.float32)

    def deterministic_reward() -> float:
        with torch.no_grad():
            a = policy.act({"states": torch.from_numpy(eval_states)}, deterministic=True)["actions"].numpy()[:, 0]
        return float(-((a - target(eval_states)) ** 2).sum(-1).mean())

    start = deterministic_reward()
    N = 256
    for version in range(15):
        s = rng.normal(size=(N, S)).astype(np.float32)
        with torch.no_grad():
            out = policy.act({"states": torch.from_numpy(s)})
        a = out["actions"].numpy()
        r = -((a[:, 0] - target(s)) ** 2).sum(-1)
        seg = Segment(
            obs={"states": s[None]},
            actions=a[None],
            logprobs=out["logprobs"].numpy()[None],
            values=out["values"].numpy()[None],
            rewards=r[None].astype(np.float32),
            terminated=np.ones((1, N), bool),
            truncated=np.zeros((1, N), bool),
            final_obs={"states": s[None].copy()},
            next_obs={"states": rng.normal(size=(N, S)).astype(np.float32)},
            versions=np.array([version], np.int64),
            task_ids=np.zeros(N, np.int64),
            env_steps=np.array(N, np.int64),
            ep_returns=r.astype(np.float32),
            ep_lengths=np.ones(N, np.int32),
            ep_success=np.zeros(N, bool),
            ep_task_ids=np.zeros(N, np.int64),
            extras={},
        )
        metrics = trainer.step([seg], version)
        assert metrics["train/dropped_samples"] == 0.0
    end = deterministic_reward()

    assert start < -0.2  # the untrained policy outputs ~0, far from the target
    assert end > 0.25 * start  # squared error cut by more than 4x (in practice ~50x)


def test_fused_adam_gives_the_plain_adam_update():
    """The trainer's fused Adam is a speed choice: after several updates the weights are those of
    torch's per-tensor Adam up to float rounding."""
    policies = [make_policy(0), make_policy(0)]
    trainers = [Trainer(p, PPOConfig(update_epochs=3, num_minibatches=4, lr=1e-3)) for p in policies]
    assert trainers[0].optimizer.param_groups[0]["fused"]
    groups = trainers[1].optimizer.param_groups
    trainers[1].optimizer = torch.optim.Adam(
        [{k: v for k, v in g.items() if k not in ("fused", "foreach")} for g in groups], foreach=False
    )
    for version in range(4):
        segs = [make_segment(policies[0], 8, 4, [version] * 8, seed=10 * version + i) for i in range(2)]
        for trainer in trainers:
            torch.manual_seed(version)  # the same minibatch order for both
            trainer.step(segs, version)
    for (name, a), b in zip(policies[0].named_parameters(), policies[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_observation_keys_the_policy_does_not_read_change_nothing():
    """Keys outside the policy's obs_keys (images an MLP does not look at) are left out of the
    update's tensors; the update is the same as without them."""
    policies = [make_policy(0), make_policy(0)]
    trainers = [Trainer(p, PPOConfig(update_epochs=2, num_minibatches=2)) for p in policies]
    assert trainers[0].obs_keys == frozenset({"states"})
    trunc = np.zeros((8, 4), bool)
    trunc[5, 2] = True
    plain = [make_segment(policies[0], 8, 4, [0] * 8, seed=i, truncated=trunc) for i in range(2)]
    rng = np.random.default_rng(0)
    with_images = [
        replace(
            s,
            obs={**s.obs, "main_images": rng.integers(0, 255, (8, 4, 6, 6, 3), dtype=np.uint8)},
            final_obs={**s.final_obs, "main_images": np.zeros((8, 4, 6, 6, 3), np.uint8)},
            next_obs={**s.next_obs, "main_images": np.zeros((4, 6, 6, 3), np.uint8)},
        )
        for s in plain
    ]
    batch = trainers[0].prepare(with_images, 0)
    assert set(batch.obs) == {"states"}
    outs = []
    for trainer, segs in zip(trainers, (plain, with_images)):
        torch.manual_seed(0)
        outs.append(trainer.step(segs, 0))
    assert outs[0] == outs[1]
    for a, b in zip(policies[0].parameters(), policies[1].parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("per_task", [False, True])
def test_advantage_normalisation_per_minibatch_or_per_task(per_task):
    """The first (and only) minibatch's policy loss from the formula: advantages whitened over the
    minibatch, or per task over the whole update (task ids with a gap and a negative one)."""
    policy = make_policy()
    tasks = np.array([-1, -1, 3, 3, 3, 0])
    seg = make_segment(policy, 8, 6, [0] * 8, seed=3, task_ids=tasks)
    seg.rewards[:, tasks == 3] *= 50.0  # one task's returns dwarf the others'
    cfg = PPOConfig(update_epochs=1, num_minibatches=1, norm_adv_per_task=per_task, critic_warmup_updates=0)
    trainer = Trainer(policy, cfg)
    batch = trainer.prepare([seg], version=0)
    with torch.no_grad():
        logp, _, _ = policy.evaluate(batch.obs, batch.actions, batch.extras)
    adv, row_tasks = batch.advantages.double().numpy(), np.tile(tasks, 8)
    assert np.array_equal(batch.task_ids.numpy(), row_tasks)
    groups = [row_tasks == k for k in (-1, 0, 3)] if per_task else [np.ones(len(adv), bool)]
    for g in groups:
        adv[g] = (adv[g] - adv[g].mean()) / (adv[g].std() + 1e-8)
    ratio = np.exp(logp.double().numpy() - batch.logp_old.double().numpy())
    want = np.mean(np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2)))
    metrics = trainer.step([seg], version=0)
    assert metrics["train/actor/policy_loss"] == pytest.approx(want, rel=1e-5, abs=1e-7)
