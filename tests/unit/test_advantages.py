"""Advantage normalisation, GRPO group-relative advantages, group filtering and
spreading, against plain numpy loop references."""

import math

import numpy as np
import pytest
import torch

from rlfleet.algorithms import (
    filter_groups_by_mean,
    group_relative_advantages,
    normalize_advantages,
    normalize_advantages_per_task,
    spread_over_steps,
)


def reference_grpo(returns, group_ids, eps):
    out = np.zeros(len(returns))
    for i in range(len(returns)):
        members = [returns[j] for j in range(len(returns)) if group_ids[j] == group_ids[i]]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / len(members))  # population std
        out[i] = (returns[i] - mean) / (std + eps)
    return out


def test_normalize_hand_made():
    adv = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    # mean 2.5, population std sqrt(1.25)
    out = normalize_advantages(adv, eps=0.0)
    s = math.sqrt(1.25)
    np.testing.assert_allclose(out.numpy(), [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s], rtol=1e-12)


def test_normalize_random_moments():
    rng = np.random.default_rng(0)
    x = rng.normal(loc=3.0, scale=7.0, size=1000)
    out = normalize_advantages(torch.tensor(x)).numpy()
    ref = (x - x.mean()) / (x.std(ddof=0) + 1e-8)
    np.testing.assert_allclose(out, ref, rtol=1e-10)
    assert abs(out.mean()) < 1e-10
    assert abs(out.std(ddof=0) - 1.0) < 1e-8


def test_normalize_constant_and_single_element_is_zero():
    np.testing.assert_array_equal(normalize_advantages(torch.full((5,), 3.0)).numpy(), np.zeros(5))
    np.testing.assert_array_equal(normalize_advantages(torch.tensor([2.0])).numpy(), [0.0])


def test_per_task_normalisation_matches_a_loop_per_task():
    rng = np.random.default_rng(1)
    task_ids = rng.choice([0, 2, 5], size=300)  # task ids with gaps
    # tasks on very different scales: one mean and std over all would squash tasks 0 and 2
    adv = rng.normal(size=300) * np.where(task_ids == 5, 100.0, 1.0) + np.where(task_ids == 2, 3.0, 0.0)
    out = normalize_advantages_per_task(torch.tensor(adv), torch.tensor(task_ids)).numpy()
    ref = np.zeros(300)
    for i in range(300):
        same = [adv[j] for j in range(300) if task_ids[j] == task_ids[i]]
        mean = sum(same) / len(same)
        std = math.sqrt(sum((x - mean) ** 2 for x in same) / len(same))
        ref[i] = (adv[i] - mean) / (std + 1e-8)
    np.testing.assert_allclose(out, ref, rtol=1e-10)
    for k in (0, 2, 5):  # each task: mean 0, std 1
        assert abs(out[task_ids == k].mean()) < 1e-10 and abs(out[task_ids == k].std() - 1.0) < 1e-7
    # float32 in, float32 out; a task of one row (or all equal) gets 0; given stats are used as they are
    one = normalize_advantages_per_task(torch.tensor([1.0, 5.0, 7.0]), torch.tensor([0, 1, 1]))
    assert one.dtype == torch.float32 and one[0].item() == 0.0
    given = normalize_advantages_per_task(
        torch.tensor([1.0, 5.0]),
        torch.tensor([0, 1]),
        eps=0.0,
        stats=(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 4.0])),
    )
    torch.testing.assert_close(given, torch.tensor([0.5, 1.0]))


def test_grpo_hand_made_groups():
    returns = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = group_relative_advantages(returns, group_ids, eps=1e-6)
    # group 0: mean 0.5, population std 0.5 -> +-0.5/(0.5+1e-6); group 1: all equal -> 0
    a = 0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose(adv.numpy(), [a, -a, a, -a, 0, 0, 0, 0], rtol=1e-6, atol=0)
    assert torch.equal(adv[4:], torch.zeros(4))


def test_grpo_population_std_not_sample_std():
    # group [0, 2]: mean 1, population std 1 (sample std would be sqrt(2))
    adv = group_relative_advantages(torch.tensor([0.0, 2.0], dtype=torch.float64), torch.tensor([5, 5]), eps=0.0)
    np.testing.assert_allclose(adv.numpy(), [-1.0, 1.0], rtol=1e-12)


def test_grpo_singleton_group_is_zero():
    adv = group_relative_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert adv[0].item() == 0.0
    np.testing.assert_allclose(adv[1:].numpy(), [-1.0, 1.0], rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_random_interleaved_noncontiguous_ids(seed):
    rng = np.random.default_rng(seed)
    n = 60
    group_ids = rng.choice([3, 17, 42, 1000, -7], size=n)
    returns = rng.normal(size=n)
    adv = group_relative_advantages(torch.tensor(returns), torch.tensor(group_ids, dtype=torch.long), eps=1e-6)
    np.testing.assert_allclose(adv.numpy(), reference_grpo(returns, group_ids, 1e-6), rtol=1e-10, atol=1e-12)


def test_grpo_integer_returns_are_promoted():
    adv = group_relative_advantages(torch.tensor([1, 0, 1, 0]), torch.tensor([0, 0, 0, 0]))
    assert adv.is_floating_point()
    np.testing.assert_allclose(adv.numpy(), [1, -1, 1, -1], rtol=1e-5)


def test_filter_groups_by_mean():
    returns = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 3, 3])
    # group means: g0 0.5, g1 1.0, g2 0.0, g3 0.25
    mask = filter_groups_by_mean(returns, group_ids, lo=0.01, hi=0.99)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [True, True, False, False, False, False, True, True, True, True]
    # inclusive bounds
    mask = filter_groups_by_mean(returns, group_ids, lo=0.5, hi=1.0)
    assert mask.tolist() == [True, True, True, True, False, False, False, False, False, False]


def test_filter_random_against_reference():
    rng = np.random.default_rng(3)
    group_ids = rng.integers(0, 6, size=40)
    returns = rng.random(40)
    mask = filter_groups_by_mean(torch.tensor(returns), torch.tensor(group_ids), 0.4, 0.6).numpy()
    for i in range(40):
        members = [returns[j] for j in range(40) if group_ids[j] == group_ids[i]]
        m = sum(members) / len(members)
        assert mask[i] == (0.4 <= m <= 0.6)


def test_spread_over_steps():
    traj_adv = torch.tensor([2.0, -1.0, 0.5])
    valid = torch.tensor(
        [
            [True, True, True],
            [True, False, True],
            [False, False, True],
        ]
    )
    out = spread_over_steps(traj_adv, valid)
    np.testing.assert_array_equal(out.numpy(), [[2.0, -1.0, 0.5], [2.0, 0.0, 0.5], [0.0, 0.0, 0.5]])
    # NaN advantages on fully-invalid trajectories must not leak
    out = spread_over_steps(torch.tensor([float("nan"), 1.0]), torch.tensor([[False, True]]))
    np.testing.assert_array_equal(out.numpy(), [[0.0, 1.0]])


def test_spread_shape_check():
    with pytest.raises(ValueError):
        spread_over_steps(torch.zeros(3), torch.ones(4, 2, dtype=torch.bool))


@pytest.mark.parametrize("value", [0.1, 4.99])
@pytest.mark.parametrize("group_size", [3, 16])
def test_grpo_all_equal_non_dyadic_float32_group_is_exactly_zero(value, group_size):
    # A float32 mean of G equal non-dyadic returns can land 1-2 ulp off the value; the
    # deviation over a ~0 std then gives every member the same advantage of up to +-0.5.
    returns = torch.full((group_size,), value, dtype=torch.float32)
    group_ids = torch.zeros(group_size, dtype=torch.long)
    adv = group_relative_advantages(returns, group_ids)
    assert adv.dtype == torch.float32
    assert torch.equal(adv, torch.zeros(group_size))


def test_grpo_mixed_groups_float32_matches_float64_reference():
    # An all-equal non-dyadic group next to a varied one: the equal group is 0, the other matches.
    returns = [4.99] * 16 + [0.1, 4.99, 0.1, 0.1]
    group_ids = [7] * 16 + [2] * 4
    adv = group_relative_advantages(torch.tensor(returns, dtype=torch.float32), torch.tensor(group_ids))
    assert torch.equal(adv[:16], torch.zeros(16))
    ref = reference_grpo(np.float32(returns).astype(np.float64), group_ids, 1e-6)
    np.testing.assert_allclose(adv[16:].numpy(), ref[16:], rtol=1e-6)
