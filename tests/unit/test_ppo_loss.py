"""PPO policy/value losses against hand-picked numbers and a per-sample
plain-Python reference of Schulman et al. 2017 (+ dual clip, value clipping)."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlfleet.algorithms import (
    PPOConfig,
    explained_variance,
    policy_loss,
    ppo_total_loss,
    truncated_importance_weights,
    value_loss,
)


def reference_policy_loss(logp, logp_old, adv, low, high, dual, weights):
    """Per-sample loop; written from the paper's formulas, not the module."""
    total, n_clip, n_dual, kl, rsum = 0.0, 0, 0, 0.0, 0.0
    n = len(logp)
    for i in range(n):
        r = math.exp(logp[i] - logp_old[i])
        r_clamped = min(max(r, 1 - low), 1 + high)
        surrogate = min(r * adv[i], r_clamped * adv[i])  # the PPO objective (to maximise)
        loss_i = -surrogate
        if dual is not None and adv[i] < 0 and loss_i > -dual * adv[i]:
            loss_i = -dual * adv[i]
            n_dual += 1
        total += weights[i] * loss_i
        n_clip += int(r < 1 - low or r > 1 + high)
        kl += (r - 1) - math.log(r)
        rsum += r
    return total / n, {
        "clip_fraction": n_clip / n,
        "dual_clip_fraction": n_dual / n,
        "approx_kl": kl / n,
        "ratio_mean": rsum / n,
    }


RATIOS = [0.5, 0.75, 0.9, 1.0, 1.2, 1.25, 1.5]


def _logp(ratios):
    return torch.tensor([math.log(r) for r in ratios], dtype=torch.float64)


def test_hand_picked_ratios_positive_advantage_asymmetric_clip():
    # clip range [0.8, 1.3]; A = +1 -> per-sample loss = -min(r, clamp(r))
    logp = _logp(RATIOS).requires_grad_(True)
    loss, stats = policy_loss(logp, torch.zeros(7, dtype=torch.float64), torch.ones(7, dtype=torch.float64), 0.2, 0.3)
    per_sample = [-0.5, -0.75, -0.9, -1.0, -1.2, -1.25, -1.3]
    assert loss.item() == pytest.approx(sum(per_sample) / 7, abs=1e-12)
    assert stats["clip_fraction"] == pytest.approx(3 / 7)  # 0.5, 0.75, 1.5 outside [0.8, 1.3]
    assert stats["dual_clip_fraction"] == 0.0
    assert stats["ratio_mean"] == pytest.approx(sum(RATIOS) / 7, abs=1e-12)
    assert stats["approx_kl"] == pytest.approx(sum((r - 1) - math.log(r) for r in RATIOS) / 7, abs=1e-12)
    loss.backward()
    # d/dlogp of -r*A/N = -r/N where unclipped; 0 where the upper clip is active (r=1.5).
    # Below the range with A > 0 the min picks the unclipped r, so gradient flows (r=0.5, 0.75).
    expected_grad = [-r / 7 for r in RATIOS]
    expected_grad[-1] = 0.0
    np.testing.assert_allclose(logp.grad.numpy(), expected_grad, rtol=1e-12, atol=1e-15)


def test_hand_picked_ratios_negative_advantage_asymmetric_clip():
    # A = -1 -> per-sample loss = max(r, clamp(r, 0.8, 1.3))
    logp = _logp(RATIOS).requires_grad_(True)
    loss, stats = policy_loss(logp, torch.zeros(7, dtype=torch.float64), -torch.ones(7, dtype=torch.float64), 0.2, 0.3)
    per_sample = [0.8, 0.8, 0.9, 1.0, 1.2, 1.25, 1.5]
    assert loss.item() == pytest.approx(sum(per_sample) / 7, abs=1e-12)
    assert stats["clip_fraction"] == pytest.approx(3 / 7)
    loss.backward()
    expected_grad = [r / 7 for r in RATIOS]
    expected_grad[0] = expected_grad[1] = 0.0  # lower clip active for A < 0
    np.testing.assert_allclose(logp.grad.numpy(), expected_grad, rtol=1e-12, atol=1e-15)


def test_symmetric_vs_asymmetric_high_clip():
    # r = 1.25, A = +1: clipped to 1.2 with high=0.2, untouched with high=0.3
    logp, old, adv = _logp([1.25]), torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    assert policy_loss(logp, old, adv, 0.2, 0.2)[0].item() == pytest.approx(-1.2, abs=1e-12)
    assert policy_loss(logp, old, adv, 0.2, 0.3)[0].item() == pytest.approx(-1.25, abs=1e-12)
    assert policy_loss(logp, old, adv, 0.2, 0.2)[1]["clip_fraction"] == 1.0
    assert policy_loss(logp, old, adv, 0.2, 0.3)[1]["clip_fraction"] == 0.0
    # r = 0.75, A = -1: lower bound 0.8 with low=0.2, 0.75 untouched with low=0.3
    logp, adv = _logp([0.75]), -torch.ones(1, dtype=torch.float64)
    assert policy_loss(logp, old, adv, 0.2, 0.2)[0].item() == pytest.approx(0.8, abs=1e-12)
    assert policy_loss(logp, old, adv, 0.3, 0.2)[0].item() == pytest.approx(0.75, abs=1e-12)


def test_dual_clip_bounds_negative_advantages():
    ratios = [0.5, 2.0, 5.0, 10.0]
    logp = _logp(ratios).requires_grad_(True)
    old = torch.zeros(4, dtype=torch.float64)
    adv = -torch.ones(4, dtype=torch.float64)
    loss_plain, stats_plain = policy_loss(logp, old, adv, 0.2, 0.2)
    assert loss_plain.item() == pytest.approx((0.8 + 2.0 + 5.0 + 10.0) / 4, abs=1e-12)
    assert stats_plain["dual_clip_fraction"] == 0.0

    loss, stats = policy_loss(logp, old, adv, 0.2, 0.2, dual_clip=3.0)
    # min(max(r, clamp(r)), c) = [0.8, 2.0, 3.0, 3.0]
    assert loss.item() == pytest.approx((0.8 + 2.0 + 3.0 + 3.0) / 4, abs=1e-12)
    assert stats["dual_clip_fraction"] == 0.5
    loss.backward()
    np.testing.assert_allclose(logp.grad.numpy(), [0.0, 2.0 / 4, 0.0, 0.0], rtol=1e-12, atol=1e-15)

    # positive advantages are untouched by the dual clip
    adv_pos = torch.ones(4, dtype=torch.float64)
    a = policy_loss(_logp(ratios), old, adv_pos, 0.2, 0.2, dual_clip=3.0)
    b = policy_loss(_logp(ratios), old, adv_pos, 0.2, 0.2)
    assert a[0].item() == b[0].item() == pytest.approx(-(0.5 + 1.2 + 1.2 + 1.2) / 4, abs=1e-12)
    assert a[1]["dual_clip_fraction"] == 0.0


def test_dual_clip_scales_with_advantage_magnitude():
    # A = -2, r = 5, c = 3: standard loss 10, dual bound -c*A = 6
    loss, _ = policy_loss(
        _logp([5.0]),
        torch.zeros(1, dtype=torch.float64),
        torch.tensor([-2.0], dtype=torch.float64),
        0.2,
        0.2,
        dual_clip=3.0,
    )
    assert loss.item() == pytest.approx(6.0, abs=1e-12)


def test_importance_weights_multiply_per_sample_loss():
    ratios = [1.0, 1.5, 0.5]
    adv = torch.tensor([2.0, 1.0, -1.0], dtype=torch.float64)
    w = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    loss, _ = policy_loss(_logp(ratios), torch.zeros(3, dtype=torch.float64), adv, 0.2, 0.2, weights=w)
    # per-sample: [-2.0, -1.2, 0.8] weighted: [-2.0, -0.6, 0.2]
    assert loss.item() == pytest.approx((-2.0 - 0.6 + 0.2) / 3, abs=1e-12)


def test_on_policy_weights_leave_loss_unchanged():
    torch.manual_seed(0)
    logp = torch.randn(32, dtype=torch.float64)
    old = logp + 0.1 * torch.randn(32, dtype=torch.float64)
    adv = torch.randn(32, dtype=torch.float64)
    w = truncated_importance_weights(old, old.clone())
    assert policy_loss(logp, old, adv, 0.2, 0.2, weights=w)[0].item() == policy_loss(logp, old, adv, 0.2, 0.2)[0].item()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dual", [None, 3.0])
def test_random_against_reference(seed, dual):
    rng = np.random.default_rng(seed)
    n = 257
    logp_old = rng.normal(size=n) - 2.0
    logp = logp_old + rng.normal(scale=0.6, size=n)
    adv = rng.normal(size=n)
    w = np.minimum(np.exp(rng.normal(scale=0.3, size=n)), 1.0)
    ref_loss, ref_stats = reference_policy_loss(logp, logp_old, adv, 0.15, 0.28, dual, w)
    loss, stats = policy_loss(
        torch.tensor(logp),
        torch.tensor(logp_old),
        torch.tensor(adv),
        0.15,
        0.28,
        dual_clip=dual,
        weights=torch.tensor(w),
    )
    assert loss.item() == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    for k, v in ref_stats.items():
        assert stats[k] == pytest.approx(v, rel=1e-10, abs=1e-12), k
    if dual is not None:
        assert stats["dual_clip_fraction"] > 0.0  # the random draw exercises the dual clip
    assert stats["policy_loss"] == pytest.approx(ref_loss, rel=1e-10)
    assert all(isinstance(v, float) for v in stats.values())


def test_approx_kl_zero_on_policy():
    logp = torch.randn(10)
    _, stats = policy_loss(logp, logp.clone(), torch.randn(10), 0.2, 0.2)
    assert stats["approx_kl"] == 0.0 and stats["ratio_mean"] == 1.0 and stats["clip_fraction"] == 0.0


def test_invalid_dual_clip_raises():
    with pytest.raises(ValueError):
        policy_loss(torch.zeros(2), torch.zeros(2), torch.ones(2), 0.2, 0.2, dual_clip=1.0)


# ---------------------------------------------------------------- value loss


def test_value_loss_hand_picked_clipping():
    values = torch.tensor([0.5, 0.1, -0.5, 0.5], dtype=torch.float64, requires_grad=True)
    values_old = torch.zeros(4, dtype=torch.float64)
    returns = torch.tensor([1.0, 1.0, 0.0, -1.0], dtype=torch.float64)
    # v_clip = [0.2, 0.1, -0.2, 0.2]
    # unclipped sq: [0.25, 0.81, 0.25, 2.25]; clipped sq: [0.64, 0.81, 0.04, 1.44]
    loss, stats = value_loss(values, values_old, returns, value_clip=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 0.25 + 2.25) / 4, abs=1e-12)
    assert stats["value_clip_ratio"] == 0.25  # only sample 0: clipped term strictly larger
    assert stats["value_loss"] == pytest.approx(loss.item())
    loss.backward()
    # grad = (v - R)/N where the unclipped term is used; 0 for sample 0 (clipped, clamp saturated)
    np.testing.assert_allclose(
        values.grad.numpy(), [0.0, (0.1 - 1.0) / 4, (-0.5) / 4, (0.5 + 1.0) / 4], rtol=1e-12, atol=1e-15
    )


def test_value_loss_unclipped():
    values = torch.tensor([0.5, 0.1, -0.5, 0.5], dtype=torch.float64)
    loss, stats = value_loss(
        values,
        torch.zeros(4, dtype=torch.float64),
        torch.tensor([1.0, 1.0, 0.0, -1.0], dtype=torch.float64),
        value_clip=None,
    )
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.81 + 0.25 + 2.25) / 4, abs=1e-12)
    assert stats["value_clip_ratio"] == 0.0


def test_value_loss_random_against_reference():
    rng = np.random.default_rng(5)
    v, v_old, R = rng.normal(size=100), rng.normal(size=100), rng.normal(size=100)
    c = 0.3
    acc, n_clip = 0.0, 0
    for i in range(100):
        vc = v_old[i] + min(max(v[i] - v_old[i], -c), c)
        a, b = (v[i] - R[i]) ** 2, (vc - R[i]) ** 2
        acc += max(a, b)
        n_clip += int(b > a)
    loss, stats = value_loss(torch.tensor(v), torch.tensor(v_old), torch.tensor(R), c)
    assert loss.item() == pytest.approx(0.5 * acc / 100, rel=1e-12)
    assert stats["value_clip_ratio"] == pytest.approx(n_clip / 100)


# ---------------------------------------------------------- explained variance


def test_explained_variance():
    def ev(values, returns):
        return explained_variance(float(np.var(returns)), float(np.var(np.subtract(returns, values))))

    R = np.array([1.0, 2.0, 3.0, 4.0])
    assert ev(R.copy(), R) == 1.0
    assert ev(np.full(4, 2.5), R) == pytest.approx(0.0, abs=1e-12)
    # V = 0: Var[R - 0] / Var[R] = 1 -> 0 ... V = -R: Var[2R]/Var[R] = 4 -> -3
    assert ev(-R, R) == pytest.approx(-3.0, abs=1e-12)
    assert math.isnan(ev(np.random.default_rng(0).normal(size=4), np.full(4, 7.0)))
    assert math.isnan(explained_variance(float("nan"), 1.0))


# ----------------------------------------------------------- total loss / cfg


def test_ppo_total_loss():
    cfg = PPOConfig(vf_coef=0.5, ent_coef=0.01)
    total = ppo_total_loss(torch.tensor(1.0), torch.tensor(2.0), torch.tensor([1.0, 3.0]), cfg)
    assert total.item() == pytest.approx(1.0 + 0.5 * 2.0 - 0.01 * 2.0, abs=1e-7)


def test_config_defaults_and_omegaconf():
    cfg = OmegaConf.structured(PPOConfig)
    assert cfg.dual_clip is None and cfg.value_clip == 0.2 and cfg.rho_bar == 1.0 and cfg.max_policy_lag == 4
    merged = OmegaConf.to_object(OmegaConf.merge(cfg, {"dual_clip": 3.0, "clip_ratio_high": 0.28}))
    assert isinstance(merged, PPOConfig) and merged.dual_clip == 3.0 and merged.clip_ratio_high == 0.28
    with pytest.raises(ValueError):
        PPOConfig(dual_clip=0.5)
    with pytest.raises(ValueError):
        PPOConfig(clip_ratio_low=1.0)


# ------------------------------------------------------------ gradient sanity


def test_end_to_end_gradients_are_finite_and_nonzero():
    torch.manual_seed(0)
    obs_dim, act_dim, n = 6, 3, 64
    actor = torch.nn.Linear(obs_dim, act_dim)
    critic = torch.nn.Linear(obs_dim, 1)
    log_std = torch.nn.Parameter(torch.zeros(act_dim))
    obs = torch.randn(n, obs_dim)
    with torch.no_grad():
        dist_old = torch.distributions.Normal(actor(obs), log_std.exp())
        actions = dist_old.sample()
        logp_old = dist_old.log_prob(actions).sum(-1)
        v_old = critic(obs).squeeze(-1)
    behaviour_logp = logp_old + 0.2 * torch.randn(n)  # stale actors
    returns = torch.randn(n)
    adv = torch.randn(n)

    # take one step so ratio != 1 and the clip is exercised
    with torch.no_grad():
        actor.weight.add_(0.3 * torch.randn_like(actor.weight))
    cfg = PPOConfig(dual_clip=3.0, ent_coef=0.01)
    dist = torch.distributions.Normal(actor(obs), log_std.exp())
    logp = dist.log_prob(actions).sum(-1)
    w = truncated_importance_weights(logp_old, behaviour_logp, cfg.rho_bar)
    pg, pg_stats = policy_loss(logp, logp_old, adv, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.dual_clip, w)
    vl, _ = value_loss(critic(obs).squeeze(-1), v_old, returns, cfg.value_clip)
    loss = ppo_total_loss(pg, vl, dist.entropy().sum(-1), cfg)
    loss.backward()
    for p in [actor.weight, actor.bias, critic.weight, critic.bias, log_std]:
        assert p.grad is not None and torch.isfinite(p.grad).all()
        assert p.grad.abs().sum().item() > 0
    assert 0.0 < pg_stats["clip_fraction"] < 1.0
    assert pg_stats["approx_kl"] > 0.0
