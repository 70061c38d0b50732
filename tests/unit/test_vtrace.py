"""V-trace (IMPALA eq. 1) against a naive double loop written from the paper, with episode
boundaries; exact unit importance weights at zero policy lag; the trainer's vtrace mode."""

import math

import numpy as np
import pytest
import torch
from mlp_segments import make_segment

from rlfleet.algorithms import PPOConfig, bootstrap_next_values, compute_gae
from rlfleet.algorithms.vtrace import chunk_log_ratio, vtrace
from rlfleet.learner.trainer import Trainer
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig


def naive_vtrace(log_rho, r, V, V_last, term, trunc, V_final, gamma, rho_bar, c_bar, lam):
    """Per (s, t) double loop, straight from Espeholt et al. 2018 eq. 1 and sec. 4.2.

    Episode boundaries: the sum for v_s runs to the end of s's episode (or of the rollout);
    V(x_{t+1}) after the episode's last step is 0 (terminated), the final observation's value
    (truncated) or the value after the rollout (last step).
    """
    T, B = r.shape
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    for b in range(B):

        def v_next(t, b=b):  # V(x_{t+1}) as seen from step t
            if term[t, b]:
                return 0.0
            if trunc[t, b]:
                return V_final[t, b]
            return V_last[b] if t == T - 1 else V[t + 1, b]

        def ended(t, b=b):
            return term[t, b] or trunc[t, b] or t == T - 1

        rho = [min(rho_bar, math.exp(log_rho[t, b])) for t in range(T)]
        c = [lam * min(c_bar, math.exp(log_rho[t, b])) for t in range(T)]
        for s in range(T):
            total, t, trace = 0.0, s, 1.0
            while True:
                delta = rho[t] * (r[t, b] + gamma * v_next(t) - V[t, b])
                total += gamma ** (t - s) * trace * delta
                if ended(t):
                    break
                trace *= c[t]
                t += 1
            vs[s, b] = V[s, b] + total
        for s in range(T):
            v_s1 = v_next(s) if ended(s) else vs[s + 1, b]
            adv[s, b] = rho[s] * (r[s, b] + gamma * v_s1 - V[s, b])
    return vs, adv


def random_case(seed, T=7, B=4):
    rng = np.random.default_rng(seed)
    term = np.zeros((T, B), bool)
    trunc = np.zeros((T, B), bool)
    term[2, 0] = True
    trunc[4, 1] = True
    term[1, 2] = trunc[5, 2] = True
    trunc[T - 1, 3] = True  # truncated on the rollout's last step
    return dict(
        log_rho=rng.normal(scale=0.5, size=(T, B)),
        r=rng.normal(size=(T, B)),
        V=rng.normal(size=(T, B)),
        V_last=rng.normal(size=B),
        term=term,
        trunc=trunc,
        V_final=rng.normal(size=(T, B)),
    )


def run_module(case, gamma, rho_bar, c_bar, lam):
    t = {k: torch.as_tensor(v, dtype=torch.float64) if v.dtype != bool else torch.as_tensor(v) for k, v in case.items()}
    next_values = bootstrap_next_values(t["V"], t["V_last"], t["term"], t["trunc"], t["V_final"])
    return vtrace(t["log_rho"], t["r"], t["V"], next_values, t["term"] | t["trunc"], gamma, rho_bar, c_bar, lam)


@pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 1.0), (1.2, 0.9, 0.95), (0.8, 1.5, 0.7)])
def test_vtrace_matches_naive_double_loop_with_episode_boundaries(rho_bar, c_bar, lam):
    gamma = 0.9
    for seed in range(3):
        case = random_case(seed)
        vs, adv = run_module(case, gamma, rho_bar, c_bar, lam)
        ref_vs, ref_adv = naive_vtrace(**case, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, lam=lam)
        np.testing.assert_allclose(vs.numpy(), ref_vs, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-12, atol=1e-12)


def test_on_policy_vtrace_is_the_td_lambda_return():
    """All ratios exactly 1 (zero lag): v_s is GAE(gamma, lambda)'s return target."""
    case = random_case(5)
    case["log_rho"] = np.zeros_like(case["log_rho"])
    gamma, lam = 0.97, 0.9
    vs, adv = run_module(case, gamma, 1.0, 1.0, lam)
    t = {k: torch.as_tensor(v) for k, v in case.items()}
    next_values = bootstrap_next_values(t["V"], t["V_last"], t["term"], t["trunc"], t["V_final"])
    _, gae_returns = compute_gae(t["r"], t["V"], next_values, t["term"] | t["trunc"], gamma, lam)
    np.testing.assert_allclose(vs.numpy(), gae_returns.numpy(), rtol=1e-12, atol=1e-12)
    # with lambda = 1 the policy-gradient advantage is the Monte-Carlo advantage: v_s - V(x_s)
    vs1, adv1 = run_module(case, gamma, 1.0, 1.0, 1.0)
    np.testing.assert_allclose(adv1.numpy(), (vs1 - t["V"]).numpy(), rtol=1e-12, atol=1e-12)


def test_chunk_log_ratio_sums_over_logprob_dims_and_is_exactly_zero_when_equal():
    mu = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, float("-inf"), -1.0]])
    pi = torch.tensor([[-1.0, -1.5, -0.25], [-3.0, float("-inf"), -1.0]])
    out = chunk_log_ratio(pi, mu)
    assert out.shape == (2,)
    assert out[0].item() == pytest.approx(0.75)
    assert out[1].item() == 0.0  # equal log-probs (an infinite one included): ratio exactly 1
    assert torch.equal(chunk_log_ratio(mu[:, 0], mu[:, 0]), torch.zeros(2))  # [N] per-chunk log-probs


# --- the trainer's vtrace mode ------------------------------------------------------------------

S, D, K = 5, 2, 1


def make_policy():
    torch.manual_seed(0)
    return GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[16, 16]))


def test_trainer_vtrace_at_zero_lag_has_unit_weights_and_gae_targets():
    policy = make_policy()
    term = np.zeros((6, 3), bool)
    term[2, 1] = True
    trunc = np.zeros((6, 3), bool)
    trunc[4, 0] = True
    # behaviour log-probs far from the learner's: at lag 0 they *are* pi_old, so rho = c = 1 exactly
    seg = make_segment(policy, 6, 3, [4] * 6, logp_shift=0.7, terminated=term, truncated=trunc)
    vt = Trainer(policy, PPOConfig(off_policy="vtrace", gamma=0.9, gae_lambda=0.8)).prepare([seg], version=4)
    gae = Trainer(policy, PPOConfig(gamma=0.9, gae_lambda=0.8)).prepare([seg], version=4)
    assert torch.equal(vt.is_weights, torch.ones(18))
    torch.testing.assert_close(vt.returns, gae.returns, rtol=1e-6, atol=1e-6)
    assert torch.equal(vt.logp_old, torch.from_numpy(seg.logprobs.reshape(-1)))


def test_trainer_vtrace_with_lag_matches_the_formula():
    """Lag 1 (version 3 at learner version 4): rho = min(rho_bar, pi_old / mu) with pi_old the
    learner's log-prob, here exp(+0.3) and exp(-0.3) for two behaviour shifts."""
    policy = make_policy()
    gamma, lam, rho_bar, c_bar = 0.9, 0.95, 1.1, 1.0
    trainer = Trainer(
        policy, PPOConfig(off_policy="vtrace", gamma=gamma, gae_lambda=lam, rho_bar=rho_bar, vtrace_c_bar=c_bar)
    )
    for shift in (-0.3, 0.3):
        seg = make_segment(policy, 5, 2, [3] * 5, logp_shift=shift, seed=1)
        batch = trainer.prepare([seg], version=4)
        assert torch.equal(batch.is_weights, torch.ones(10))  # the correction is inside the advantage
        with torch.no_grad():
            states = torch.from_numpy(seg.obs["states"])
            V = policy.value({"states": states.reshape(-1, S)}).double().reshape(5, 2).numpy()
            V_last = policy.value({"states": torch.from_numpy(seg.next_obs["states"])}).double().numpy()
            logp, _, _ = policy.evaluate(
                {"states": states.reshape(-1, S)}, torch.from_numpy(seg.actions).reshape(10, K, D)
            )
        log_rho = (logp.double().numpy() - seg.logprobs.reshape(-1).astype(np.float64)).reshape(5, 2)
        np.testing.assert_allclose(log_rho, -shift, atol=1e-5)
        z = np.zeros((5, 2), bool)
        ref_vs, ref_adv = naive_vtrace(
            log_rho, seg.rewards.astype(np.float64), V, V_last, z, z, np.zeros((5, 2)), gamma, rho_bar, c_bar, lam
        )
        np.testing.assert_allclose(batch.returns.numpy(), ref_vs.reshape(-1), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(batch.advantages.numpy(), ref_adv.reshape(-1), rtol=1e-4, atol=1e-4)


def test_vtrace_update_runs_and_reports():
    policy = make_policy()
    trainer = Trainer(policy, PPOConfig(off_policy="vtrace", update_epochs=1, num_minibatches=2))
    segs = [make_segment(policy, 4, 4, [2, 3, 3, 3], logp_shift=0.1, seed=i) for i in range(2)]
    metrics = trainer.step(segs, version=3)
    assert metrics["train/samples"] == 32 and metrics["rollout/is_weight_mean"] == 1.0
    assert math.isfinite(metrics["train/critic/value_loss"]) and math.isfinite(metrics["train/actor/policy_loss"])
    assert metrics["throughput/policy_lag_count/0"] == 24 and metrics["throughput/policy_lag_count/1"] == 8
