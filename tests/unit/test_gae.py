"""GAE against an independent reference: the *definition*
A_t = sum_l (gamma*lam)^l delta_{t+l} (stopping at the episode end), written as a
forward double loop in plain numpy, rather than the module's reverse recursion."""

import numpy as np
import pytest
import torch

from rlfleet.algorithms import bootstrap_next_values, compute_gae


def reference_gae(rewards, values, next_values, dones, gamma, lam):
    """Forward-sum definition of GAE, one env column at a time."""
    rewards, values, next_values, dones = (
        np.asarray(x, dtype=np.float64) for x in (rewards, values, next_values, dones)
    )
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            total = 0.0
            coef = 1.0
            for k in range(t, T):
                delta = rewards[k, b] + gamma * next_values[k, b] - values[k, b]
                total += coef * delta
                if dones[k, b]:
                    break
                coef *= gamma * lam
            adv[t, b] = total
    return adv, adv + values


def reference_next_values(values, last_value, terminated, truncated, final_values):
    T, B = values.shape
    out = np.zeros((T, B))
    for t in range(T):
        for b in range(B):
            if terminated[t, b]:
                out[t, b] = 0.0
            elif truncated[t, b]:
                out[t, b] = final_values[t, b]
            elif t == T - 1:
                out[t, b] = last_value[b]
            else:
                out[t, b] = values[t + 1, b]
    return out


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


REWARDS = [[1.0], [2.0], [3.0]]
VALUES = [[0.5], [1.0], [1.5]]


def test_hand_computed_no_dones():
    # gamma=0.9, lam=0.8 -> gamma*lam=0.72
    # delta = [1 + .9*1 - .5, 2 + .9*1.5 - 1, 3 + .9*2 - 1.5] = [1.4, 2.35, 3.3]
    # A2 = 3.3; A1 = 2.35 + .72*3.3 = 4.726; A0 = 1.4 + .72*4.726 = 4.80272
    adv, ret = compute_gae(_t(REWARDS), _t(VALUES), _t([[1.0], [1.5], [2.0]]), _t([[0], [0], [0]]), 0.9, 0.8)
    np.testing.assert_allclose(adv.numpy()[:, 0], [4.80272, 4.726, 3.3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ret.numpy()[:, 0], [5.30272, 5.726, 4.8], rtol=0, atol=1e-12)


def test_hand_computed_termination_mid_sequence():
    # terminated after step 1: next_values[1] = 0 and the recursion is cut.
    # delta1 = 2 - 1 = 1.0 -> A1 = 1.0; A2 = 3.3; A0 = 1.4 + .72*1.0 = 2.12
    adv, _ = compute_gae(_t(REWARDS), _t(VALUES), _t([[1.0], [0.0], [2.0]]), _t([[0], [1], [0]]), 0.9, 0.8)
    np.testing.assert_allclose(adv.numpy()[:, 0], [2.12, 1.0, 3.3], rtol=0, atol=1e-12)


def test_hand_computed_truncation_bootstrap():
    # truncated after step 1 with V(final obs) = 5.0: bootstrap, but cut the recursion.
    # delta1 = 2 + .9*5 - 1 = 5.5 -> A1 = 5.5; A0 = 1.4 + .72*5.5 = 5.36
    values = _t(VALUES)
    next_values = bootstrap_next_values(
        values,
        last_value=_t([2.0]),
        terminated=torch.tensor([[False], [False], [False]]),
        truncated=torch.tensor([[False], [True], [False]]),
        final_values=_t([[99.0], [5.0], [99.0]]),
    )
    np.testing.assert_allclose(next_values.numpy()[:, 0], [1.0, 5.0, 2.0])
    adv, ret = compute_gae(_t(REWARDS), values, next_values, torch.tensor([[False], [True], [False]]), 0.9, 0.8)
    np.testing.assert_allclose(adv.numpy()[:, 0], [5.36, 5.5, 3.3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ret.numpy()[:, 0], [5.86, 6.5, 4.8], rtol=0, atol=1e-12)


def test_bootstrap_next_values_hand_made():
    values = _t([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    last_value = _t([4.0, 40.0])
    terminated = torch.tensor([[False, True], [False, False], [True, False]])
    truncated = torch.tensor([[True, True], [False, False], [True, True]])  # terminated wins over truncated
    final_values = _t([[-1.0, -10.0], [-2.0, -20.0], [-3.0, -30.0]])
    out = bootstrap_next_values(values, last_value, terminated, truncated, final_values)
    expected = [[-1.0, 0.0], [3.0, 30.0], [0.0, -30.0]]
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_against_reference(seed):
    rng = np.random.default_rng(seed)
    T, B = 17, 5
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    last_value = rng.normal(size=B)
    final_values = rng.normal(size=(T, B))
    terminated = rng.random((T, B)) < 0.15
    truncated = (rng.random((T, B)) < 0.15) & ~terminated
    gamma, lam = 0.97, 0.9

    nv_ref = reference_next_values(values, last_value, terminated, truncated, final_values)
    nv = bootstrap_next_values(
        _t(values), _t(last_value), torch.tensor(terminated), torch.tensor(truncated), _t(final_values)
    )
    np.testing.assert_allclose(nv.numpy(), nv_ref, rtol=0, atol=0)

    dones = terminated | truncated
    adv_ref, ret_ref = reference_gae(rewards, values, nv_ref, dones, gamma, lam)
    adv, ret = compute_gae(_t(rewards), _t(values), nv, torch.tensor(dones), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), adv_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), ret_ref, rtol=1e-10, atol=1e-10)

    # float dones (0/1) give identical results to bool dones
    adv_f, _ = compute_gae(_t(rewards), _t(values), nv, _t(dones.astype(np.float64)), gamma, lam)
    np.testing.assert_array_equal(adv_f.numpy(), adv.numpy())


def test_lambda_one_gives_discounted_return_and_lambda_zero_gives_td():
    rng = np.random.default_rng(7)
    T, B = 9, 3
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    dones = rng.random((T, B)) < 0.2
    # consistent bootstrapping: next_values[t] = values[t+1] inside an episode,
    # arbitrary (a bootstrap value) at episode ends and at the rollout end
    next_values = rng.normal(size=(T, B))
    for t in range(T - 1):
        for b in range(B):
            if not dones[t, b]:
                next_values[t, b] = values[t + 1, b]
    gamma = 0.95

    # lam = 1: returns = Monte-Carlo discounted return, bootstrapped at episode end / rollout end.
    mc = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            g, disc = 0.0, 1.0
            for k in range(t, T):
                g += disc * rewards[k, b]
                disc *= gamma
                if dones[k, b] or k == T - 1:
                    g += disc * next_values[k, b]
                    break
            mc[t, b] = g
    _, ret1 = compute_gae(_t(rewards), _t(values), _t(next_values), torch.tensor(dones), gamma, 1.0)
    np.testing.assert_allclose(ret1.numpy(), mc, rtol=1e-10, atol=1e-10)

    # lam = 0: one-step TD error.
    adv0, _ = compute_gae(_t(rewards), _t(values), _t(next_values), torch.tensor(dones), gamma, 0.0)
    np.testing.assert_allclose(adv0.numpy(), rewards + gamma * next_values - values, rtol=1e-12, atol=1e-12)


def test_float32_and_no_grad():
    rewards = torch.ones(4, 2)
    values = torch.zeros(4, 2, requires_grad=True)
    adv, ret = compute_gae(rewards, values, torch.zeros(4, 2), torch.zeros(4, 2), 0.5, 1.0)
    assert adv.dtype == torch.float32 and not adv.requires_grad and not ret.requires_grad
    # no bootstrap, no dones: A_t = sum_k 0.5^k over the remaining steps
    np.testing.assert_allclose(adv[:, 0].numpy(), [1.875, 1.75, 1.5, 1.0], rtol=1e-6)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        compute_gae(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 1), torch.zeros(3, 2), 0.9, 0.9)


def test_same_bits_as_the_per_step_recursion():
    """The vectorised deltas change no number: the per-step form, op for op, gives the same bits."""
    g = torch.Generator().manual_seed(3)
    T, B, gamma, lam = 17, 6, 0.99, 0.95
    rewards, values, next_values = (torch.randn(T, B, generator=g) for _ in range(3))
    dones = torch.rand(T, B, generator=g) < 0.2
    not_done = 1.0 - dones.float()
    expected = torch.zeros(T, B)
    last = torch.zeros(B)
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        last = delta + gamma * lam * not_done[t] * last
        expected[t] = last
    adv, ret = compute_gae(rewards, values, next_values, dones, gamma, lam)
    assert torch.equal(adv, expected)
    assert torch.equal(ret, expected + values)
