"""Dual clip (Ye et al. 2020) is applied for per-token / per-action log-probs, not only per chunk:
policy_loss against an element-wise reference on tiny_oft-shaped [N, K*D] log-probs, and through
Trainer.update with a real tiny_oft policy (RLinf ignores dual_clip for OFT and pi0)."""

import math

import numpy as np
import pytest
import torch

from rlfleet.algorithms import PPOConfig, normalize_advantages, policy_loss
from rlfleet.envs.api import encode_instructions
from rlfleet.learner.trainer import Trainer
from rlfleet.policies.vla import TinyOFTPolicy, VLAConfig
from rlfleet.wire.segment import Segment

K, D = 2, 4  # chunk of 2 actions of 4 dims: 8 tokens per sample


def reference(logp, logp_old, adv, low, high, dual):
    """Element-wise loop from the formulas; adv[n] applies to every element j of sample n."""
    N, P = logp.shape
    total, n_dual = 0.0, 0
    grad = np.zeros((N, P))
    for n in range(N):
        for j in range(P):
            r = math.exp(logp[n, j] - logp_old[n, j])
            a = adv[n]
            unclipped, clipped = -a * r, -a * min(max(r, 1 - low), 1 + high)
            loss, g = (unclipped, -a * r) if unclipped >= clipped else (clipped, 0.0)
            if dual is not None and a < 0 and loss > -dual * a:
                loss, g = -dual * a, 0.0
                n_dual += 1
            total += loss
            grad[n, j] = g / (N * P)
    return total / (N * P), n_dual / (N * P), grad


@pytest.mark.parametrize("N", [3, K * D])  # N == K*D: where an [N] advantage would broadcast wrongly
def test_dual_clip_on_per_token_logprobs(N):
    rng = np.random.default_rng(N)
    logp_old = rng.normal(-2.0, 0.5, size=(N, K * D))
    log_ratio = rng.choice([-0.5, 0.0, 0.1, 0.5, 1.5, 2.0], size=(N, K * D))  # ratios up to e^2 = 7.4 > c
    adv = rng.choice([-1.5, -0.5, 0.7, 1.2], size=N)
    adv[0] = -1.0  # at least one negative advantage
    log_ratio[0, 0] = 2.0
    low, high, c = 0.2, 0.28, 3.0

    for adv_in in (torch.tensor(adv), torch.tensor(adv).reshape(N, 1)):  # per sample, or already broadcast
        logp = torch.tensor(logp_old + log_ratio, requires_grad=True)
        loss, stats = policy_loss(logp, torch.tensor(logp_old), adv_in, low, high, dual_clip=c)
        loss.backward()
        want, frac, grad = reference(logp_old + log_ratio, logp_old, adv, low, high, c)
        assert loss.item() == pytest.approx(want, rel=1e-12)
        assert stats["dual_clip_fraction"] == pytest.approx(frac) and frac > 0
        np.testing.assert_allclose(logp.grad.numpy(), grad, rtol=1e-12, atol=1e-15)

    # without the dual clip the same elements are unbounded: larger loss, non-zero gradient there
    logp = torch.tensor(logp_old + log_ratio, requires_grad=True)
    loss_nodual, stats = policy_loss(logp, torch.tensor(logp_old), torch.tensor(adv), low, high)
    loss_nodual.backward()
    assert stats["dual_clip_fraction"] == 0.0
    assert loss_nodual.item() > want
    assert logp.grad[0, 0].item() == pytest.approx(-adv[0] * math.exp(2.0) / (N * K * D))


def test_advantage_that_does_not_lead_the_logprob_shape_is_an_error():
    with pytest.raises(ValueError, match="does not lead"):
        policy_loss(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(8), 0.2, 0.2)


# --- through the trainer with a real tiny_oft policy --------------------------------------------

IMG, STATE_DIM, T, B = 16, 39, 4, 3


def oft_policy() -> TinyOFTPolicy:
    torch.manual_seed(0)
    return TinyOFTPolicy(STATE_DIM, D, K, VLAConfig(name="tiny_oft", dim=32, depth=1, logprob_type="token"), IMG)


def oft_segment(policy, logp_shift: float) -> Segment:
    """Lag-0 samples whose behaviour log-probs sit ``logp_shift`` below the policy's: the lag-0
    rule makes them pi_old, so the first ratio pi/pi_old is exp(logp_shift) per token."""
    rng = np.random.default_rng(0)
    obs = {
        "main_images": rng.integers(0, 256, size=(T, B, IMG, IMG, 3), dtype=np.uint8),
        "states": rng.normal(size=(T, B, STATE_DIM)).astype(np.float32),
        "instructions": np.broadcast_to(encode_instructions(["open the drawer"] * B), (T, B, 128)).copy(),
    }
    flat = {k: torch.from_numpy(v.reshape(T * B, *v.shape[2:])) for k, v in obs.items()}
    with torch.no_grad():
        out = policy.act(flat)
    assert out["logprobs"].shape == (T * B, K * D)
    zeros = {k: np.zeros_like(v) for k, v in obs.items()}
    return Segment(
        obs=obs,
        actions=out["actions"].numpy().reshape(T, B, K, D),
        logprobs=(out["logprobs"].numpy() - logp_shift).reshape(T, B, K * D).astype(np.float32),
        values=out["values"].numpy().reshape(T, B),
        rewards=rng.normal(size=(T, B)).astype(np.float32),
        terminated=np.zeros((T, B), bool),
        truncated=np.zeros((T, B), bool),
        final_obs=zeros,
        next_obs={k: v[0] for k, v in obs.items()},
        versions=np.zeros(T, np.int64),
        task_ids=np.zeros(B, np.int64),
        env_steps=np.array(T * B * K, np.int64),
        ep_returns=np.zeros(0, np.float32),
        ep_lengths=np.zeros(0, np.int32),
        ep_success=np.zeros(0, bool),
        ep_task_ids=np.zeros(0, np.int64),
        extras={},
    )


def test_trainer_applies_dual_clip_to_tiny_oft_token_logprobs():
    shift, c = 2.0, 3.0  # per-token ratio e^2 = 7.4 > c on the first (and only) minibatch
    cfg = dict(update_epochs=1, num_minibatches=1, lr=1e-3, critic_warmup_updates=0)
    results = {}
    for dual in (None, c):
        policy = oft_policy()
        seg = oft_segment(policy, shift)
        trainer = Trainer(policy, PPOConfig(dual_clip=dual, **cfg))
        batch = trainer.prepare([seg], version=0)
        with torch.no_grad():
            logp, _, _ = policy.evaluate(batch.obs, batch.actions, batch.extras)
        adv = normalize_advantages(batch.advantages).double().numpy()
        want, frac, _ = reference(logp.double().numpy(), batch.logp_old.double().numpy(), adv, 0.2, 0.2, dual)
        metrics = trainer.step([seg], version=0)
        after = torch.cat([p.detach().flatten() for p in policy.parameters()])
        results[dual] = (metrics, want, frac, after)
        assert metrics["train/actor/policy_loss"] == pytest.approx(want, rel=1e-4)
        assert metrics["train/actor/dual_clip_fraction"] == pytest.approx(frac)

    (m_none, _, _, p_none), (m_dual, _, frac, p_dual) = results[None], results[c]
    assert (adv < 0).any() and frac > 0 and m_dual["train/actor/dual_clip_fraction"] > 0
    assert m_none["train/actor/dual_clip_fraction"] == 0.0
    assert m_dual["train/actor/policy_loss"] < m_none["train/actor/policy_loss"]  # the bound is active
    assert m_dual["train/actor/grad_norm"] != pytest.approx(m_none["train/actor/grad_norm"])
    assert not torch.equal(p_none, p_dual)  # a different gradient step
