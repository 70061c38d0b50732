"""Advantage post-processing: batch normalisation (PPO implementation detail)
and GRPO's group-relative advantages (Shao et al. 2024, "DeepSeekMath",
sec. 4.1.2, outcome supervision), used for critic-free embodied RL where a
group is several rollouts of the same task/seed."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def normalize_advantages(adv: Tensor, eps: float = 1e-8, stats: tuple[float, float] | None = None) -> Tensor:
    """Normalise to mean 0, std 1:  (A - mean(A)) / (std(A) + eps).

    Uses the *population* std (``unbiased=False``), so the result has
    population std ~1 exactly and a single-element batch gives 0 instead of
    NaN.  (CleanRL uses the sample std; the difference is a factor
    sqrt(N/(N-1)), negligible for minibatch sizes.)  Why: keeps the policy-loss
    scale independent of reward scale (PPO implementation detail, Engstrom et
    al. 2020 / Huang et al. 2022 "The 37 Implementation Details of PPO").

    ``stats``: (mean, std) computed elsewhere, e.g. over a minibatch split across DDP ranks,
    where each rank holds only its share of A.
    """
    if stats is not None:
        return (adv - stats[0]) / (stats[1] + eps)
    mean = adv.mean()
    std = adv.std(unbiased=False) if adv.numel() > 0 else adv.new_tensor(0.0)
    return (adv - mean) / (std + eps)


def group_mean_var(
    x: Tensor, groups: Tensor, num_groups: int, all_reduce: Callable[[Tensor], Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """Per-group mean and population variance of ``x`` [N] (float64, [num_groups] each).

    ``groups`` [N]: each element's group in [0, num_groups). ``all_reduce``: an in-place sum over
    processes (the learner's DDP ranks), so the statistics cover every rank's elements; two passes,
    two reductions. A group with no elements gets NaNs.
    """
    flat, g = x.detach().reshape(-1).to(torch.float64), groups.reshape(-1).long()
    sums = torch.zeros(2, num_groups, dtype=torch.float64, device=flat.device)
    sums[0].index_add_(0, g, flat)
    sums[1].index_add_(0, g, torch.ones_like(flat))
    if all_reduce is not None:
        all_reduce(sums)
    mean = sums[0] / sums[1]
    sq = torch.zeros(num_groups, dtype=torch.float64, device=flat.device).index_add_(0, g, (flat - mean[g]) ** 2)
    if all_reduce is not None:
        all_reduce(sq)
    return mean, sq / sums[1]


def normalize_advantages_per_task(
    adv: Tensor, task_ids: Tensor, eps: float = 1e-8, stats: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """Normalise each task's advantages on their own: (A_i - mean_k) / (std_k + eps), k = task of i.

    Population std per task, as `normalize_advantages`. Why: with one mean and std over a multitask
    batch, the task whose returns vary most sets the scale and a task with rare successes is
    whitened towards zero; per task, each task's better-than-usual actions weigh alike.
    ``task_ids`` [N]: non-negative task indices. ``stats``: per-task (mean, std) indexed by task id,
    computed elsewhere (`group_mean_var` over every rank's rows); None: from ``adv`` itself.
    """
    ids = task_ids.reshape(-1).long()
    if stats is None:
        mean, var = group_mean_var(adv, ids, int(ids.max()) + 1 if ids.numel() else 0)
        stats = (mean, var.sqrt())
    mean, std = stats
    return ((adv.double() - mean[ids]) / (std[ids] + eps)).to(adv.dtype)


def _group_stats(returns: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group mean and population std (float64), plus the inverse index.

    Why float64: a float32 sum of G equal non-dyadic returns (0.1, 4.99) rounds, so the mean
    lands 1-2 ulp off the common value and an all-equal group got a nonzero advantage (up to
    +-0.5 at G = 16, the deviation divided by a ~0 std).  In float64 the sum of up to 2**29
    equal float32 values is exact, so such a group has mean == value and A == 0 exactly.
    """
    if returns.dim() != 1 or group_ids.shape != returns.shape:
        raise ValueError(
            f"returns and group_ids must be 1-D of equal length, got "
            f"{tuple(returns.shape)} and {tuple(group_ids.shape)}"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() > 0 else 0
    mean, var = group_mean_var(returns, inverse, n_groups)
    return mean[inverse], var.sqrt()[inverse], inverse


def group_relative_advantages(returns: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, sec. 4.1.2):

        A_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps)

    ``std`` is the *population* std (``unbiased=False``), as in many GRPO
    implementations; others use the sample std (``torch.std`` default, a factor
    sqrt(G/(G-1)) larger).  Population std keeps a singleton group at 0 instead
    of NaN.  A group whose members all got the same return has zero advantage:
    it carries no learning signal.

    Args:
        returns: ``[N]`` scalar return of each trajectory.
        group_ids: ``[N]`` long, arbitrary (not necessarily contiguous) group labels.
    """
    out_dtype = returns.dtype if returns.is_floating_point() else torch.get_default_dtype()
    mean, std, _ = _group_stats(returns, group_ids)
    return ((returns.to(torch.float64) - mean) / (std + eps)).to(out_dtype)


def filter_groups_by_mean(returns: Tensor, group_ids: Tensor, lo: float, hi: float) -> Tensor:
    """Bool mask ``[N]`` keeping samples whose group's mean return lies in [lo, hi].

    Why: groups that all succeed or all fail have zero group-relative
    advantage and only dilute the batch (DAPO "dynamic sampling", Yu et al.
    2025; RLinf's success-rate filter).  Bounds are inclusive.
    """
    mean, _, _ = _group_stats(returns, group_ids)
    return (mean >= lo) & (mean <= hi)


def spread_over_steps(traj_adv: Tensor, valid_mask: Tensor) -> Tensor:
    """Broadcast one advantage per trajectory onto its steps.

        out[t, n] = traj_adv[n] if valid_mask[t, n] else 0

    Why: GRPO assigns the outcome advantage to every action of the trajectory;
    padding steps (after the episode ended) must contribute nothing.

    Args:
        traj_adv: ``[N]``.  valid_mask: ``[T, N]`` bool or 0/1.
    """
    if valid_mask.dim() != 2 or valid_mask.shape[1] != traj_adv.shape[0]:
        raise ValueError(f"valid_mask must be [T, N] with N={traj_adv.shape[0]}, got {tuple(valid_mask.shape)}")
    expanded = traj_adv.unsqueeze(0).expand(valid_mask.shape[0], -1)
    return torch.where(valid_mask.bool(), expanded, torch.zeros_like(expanded))
