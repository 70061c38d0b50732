"""Truncated importance weights and policy-lag bookkeeping."""

import math

import numpy as np
import pytest
import torch

from rlfleet.algorithms import lag_mask, policy_lag, truncated_importance_weights


@pytest.mark.parametrize("rho_bar", [1.0, 2.0, 1e9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_equal_logps_give_exactly_one(rho_bar, dtype):
    logp = torch.tensor([0.0, -1e-7, -3.3, -123.456, -1e4, 5.0, float("-inf")], dtype=dtype)
    w = truncated_importance_weights(logp, logp.clone(), rho_bar=rho_bar)
    assert torch.equal(w, torch.ones_like(w)), w


def test_equal_logps_with_rho_bar_below_one_gives_rho_bar():
    logp = torch.tensor([-1.0, -2.0])
    w = truncated_importance_weights(logp, logp.clone(), rho_bar=0.5)
    assert w.tolist() == [0.5, 0.5]


def test_capped_at_rho_bar_hand_made():
    behaviour = torch.zeros(3, dtype=torch.float64)
    learner_old = torch.tensor([math.log(3.0), math.log(0.5), math.log(1.5)], dtype=torch.float64)
    w1 = truncated_importance_weights(learner_old, behaviour, rho_bar=1.0)
    np.testing.assert_allclose(w1.numpy(), [1.0, 0.5, 1.0], rtol=1e-12)
    w2 = truncated_importance_weights(learner_old, behaviour, rho_bar=2.0)
    np.testing.assert_allclose(w2.numpy(), [2.0, 0.5, 1.5], rtol=1e-12)


def test_random_against_reference():
    rng = np.random.default_rng(0)
    a = rng.normal(size=200) * 2
    b = rng.normal(size=200) * 2
    for rho_bar in (0.7, 1.0, 3.0):
        w = truncated_importance_weights(torch.tensor(a), torch.tensor(b), rho_bar).numpy()
        ref = [min(math.exp(x - y), rho_bar) for x, y in zip(a, b)]
        np.testing.assert_allclose(w, ref, rtol=1e-12)


def test_weights_are_detached():
    a = torch.randn(5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    w = truncated_importance_weights(a, b)
    assert not w.requires_grad


def test_invalid_rho_bar_raises():
    with pytest.raises(ValueError):
        truncated_importance_weights(torch.zeros(2), torch.zeros(2), rho_bar=0.0)


def test_policy_lag_and_mask():
    lags = policy_lag(10, torch.tensor([10, 9, 6, 5]))
    assert lags.dtype == torch.long
    assert lags.tolist() == [0, 1, 4, 5]
    mask = lag_mask(lags, max_policy_lag=4)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [True, True, True, False]
    assert lag_mask(lags, max_policy_lag=0).tolist() == [True, False, False, False]


def test_policy_lag_rejects_samples_from_the_future():
    with pytest.raises(ValueError):
        policy_lag(3, torch.tensor([2, 4]))
