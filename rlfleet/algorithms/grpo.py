"""GRPO for embodied RL through the asynchronous fleet (Shao et al. 2024, "DeepSeekMath",
sec. 4.1.2, outcome supervision; critic-free, as RLinf's embodied GRPO).

A *group* is G environments reset to the same initial state (same task, same seed) in one
actor segment; every segment holds whole episodes (its first step is an episode start, every
env ends its episode within it), so a group never spans segments. The actor side (grouped
resets, seeds) lives in :mod:`rlfleet.actors.groups`; this module holds the checks on a GRPO
run's shape (:func:`episode_rollout_len`, :func:`check_stage_rows`, :func:`check_task_rows`) and
the learner's math on one segment's ``[T, B]`` tensors:

    valid[t, b] = no episode end in column b before step t       (steps after the end are the
                                                                  auto-reset's next episode)
    R_b         = sum_t valid[t, b] * r[t, b]                     (undiscounted outcome)
    A_b         = (R_b - mean_{g(b)} R) / (std_{g(b)} R + eps)    (group_relative_advantages)
    keep_b      = lo <= mean_{g(b)} R <= hi                        (filter_groups_by_mean; optional)
    A[t, b]     = A_b where valid[t, b], rows kept where valid & keep  (spread_over_steps)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from rlfleet.algorithms.advantages import filter_groups_by_mean, group_relative_advantages, spread_over_steps


def episode_valid_mask(terminated: Tensor, truncated: Tensor) -> Tensor:
    """valid[t, b] = (sum_{t' < t} done[t', b]) == 0, with done = terminated | truncated.

    Why: a segment starts at an episode start; the step an episode ends on is its last valid
    step, and what follows in that column is the auto-reset's next episode, which belongs to no
    group and must contribute nothing.
    """
    if terminated.dim() != 2 or truncated.shape != terminated.shape:
        raise ValueError(
            f"terminated and truncated must both be [T, B], got {tuple(terminated.shape)} and {tuple(truncated.shape)}"
        )
    done = (terminated.bool() | truncated.bool()).long()
    ended_before = torch.cumsum(done, dim=0) - done
    return ended_before == 0


def trajectory_returns(rewards: Tensor, valid: Tensor) -> Tensor:
    """R_b = sum_t valid[t, b] * r[t, b]  (undiscounted: GRPO scores an episode's outcome)."""
    if rewards.shape != valid.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and valid {tuple(valid.shape)} differ")
    r = rewards if rewards.is_floating_point() else rewards.float()
    return torch.where(valid.bool(), r, torch.zeros_like(r)).sum(dim=0)


@dataclass
class GRPOSegment:
    """GRPO quantities of one segment. ``keep`` marks the rows the update trains on."""

    advantages: Tensor  # [T, B] A_b on valid steps, 0 elsewhere
    keep: Tensor  # [T, B] bool: valid step of a trajectory whose group passed the filter
    returns: Tensor  # [B] R_b
    traj_advantages: Tensor  # [B] A_b
    group_kept: Tensor  # [B] bool: the trajectory's group passed the filter
    valid: Tensor  # [T, B] bool


def grpo_segment(
    rewards: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    group_ids: Tensor,
    group_filter: Sequence[float] | None = None,
    eps: float = 1e-6,
) -> GRPOSegment:
    """Group-relative advantages of one whole-episode segment (formulas in the module docstring).

    Args:
        rewards, terminated, truncated: ``[T, B]`` (rewards already scaled).
        group_ids: ``[B]`` group label of each env column.
        group_filter: ``(lo, hi)`` keeps groups whose mean return lies in [lo, hi]; None keeps all.

    Raises ValueError when some env did not finish its episode inside the segment (the segment
    was not cut at episode boundaries, so the returns would be partial).
    """
    if rewards.dim() != 2 or group_ids.shape != rewards.shape[1:]:
        raise ValueError(
            f"rewards must be [T, B] and group_ids [B], got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    valid = episode_valid_mask(terminated, truncated)
    done = terminated.bool() | truncated.bool()
    unfinished = (~done.any(dim=0)).nonzero().flatten()
    if len(unfinished):
        raise ValueError(
            f"GRPO needs whole episodes per segment; env columns {unfinished.tolist()} "
            f"did not end their episode within the segment's {rewards.shape[0]} steps"
        )
    returns = trajectory_returns(rewards, valid)
    traj_adv = group_relative_advantages(returns, group_ids, eps)
    if group_filter is None:
        group_kept = torch.ones_like(returns, dtype=torch.bool)
    else:
        lo, hi = group_filter
        group_kept = filter_groups_by_mean(returns, group_ids, float(lo), float(hi))
    advantages = spread_over_steps(traj_adv, valid)
    keep = valid & group_kept.unsqueeze(0)
    return GRPOSegment(advantages, keep, returns, traj_adv, group_kept, valid)


# The shape of a GRPO run, checked by the learner (before it starts) and each actor.


def episode_rollout_len(max_episode_steps: int, chunk_size: int, terminate_on_success: bool = False) -> int:
    """T = max_episode_steps / chunk_size: the chunk steps of one full episode."""
    if terminate_on_success:  # an episode ending early would auto-reset into a cut-off second one
        raise ValueError(
            "GRPO segments hold whole episodes of a fixed length: set env.terminate_on_success=false "
            "(success_once already makes an episode's return its outcome)"
        )
    if chunk_size < 1 or max_episode_steps % chunk_size:
        raise ValueError(
            f"GRPO segments hold whole episodes: env.max_episode_steps ({max_episode_steps}) must be a "
            f"multiple of env.chunk_size ({chunk_size})"
        )
    return max_episode_steps // chunk_size


def check_stage_rows(num_envs: int, num_stages: int, group_size: int) -> None:
    """Each pipeline stage must hold whole groups."""
    if group_size < 2:
        raise ValueError(f"algorithm.group_size must be >= 2 for GRPO, got {group_size}")
    if num_envs % num_stages or (num_envs // num_stages) % group_size:
        raise ValueError(
            f"GRPO groups must not span pipeline stages: actor.num_envs ({num_envs}) / "
            f"actor.pipeline_stage_num ({num_stages}) must be a multiple of algorithm.group_size ({group_size})"
        )


def check_task_rows(task_ids: Sequence[int] | np.ndarray, group_size: int, stage: int = 0) -> None:
    """A group is G envs of one task: each task's env count in a pipeline stage must be a multiple of G."""
    ids = np.asarray(task_ids).tolist()
    counts = {task: ids.count(task) for task in dict.fromkeys(ids)}  # first-appearance order
    for task, n in counts.items():
        if n % group_size:
            raise ValueError(
                f"GRPO groups need G={group_size} envs of the same task in each pipeline stage; task id "
                f"{task} has {n} envs in stage {stage}. Make actor.num_envs / actor.pipeline_stage_num "
                f"a multiple of group_size x tasks per stage ({group_size} x {len(counts)})"
            )


def grpo_stats(parts: Sequence[GRPOSegment], group_ids: Sequence[Tensor]) -> dict[str, float]:
    """Per-update GRPO diagnostics (TensorBoard ``train/grpo/*``), over every received segment.

    groups / filtered_groups count groups (a group is per segment); zero_std_groups counts
    groups whose members all got the same return (no learning signal, advantage 0).
    """
    n_groups = n_filtered = n_zero_std = 0
    for part, gid in zip(parts, group_ids):
        labels, inverse = torch.unique(gid, return_inverse=True)
        n_groups += len(labels)
        for g in range(len(labels)):
            members = inverse == g
            n_filtered += int(not bool(part.group_kept[members].all()))
            r = part.returns[members]
            n_zero_std += int(bool((r == r[0]).all()))
    returns = torch.cat([p.returns for p in parts]).double()
    adv = torch.cat([p.traj_advantages for p in parts]).double()
    valid = torch.cat([p.valid.reshape(-1) for p in parts])
    return {
        "train/grpo/groups": float(n_groups),
        "train/grpo/filtered_groups": float(n_filtered),
        "train/grpo/zero_std_groups": float(n_zero_std),
        "train/grpo/trajectory_return_mean": returns.mean().item(),
        "train/grpo/trajectory_return_std": returns.std(unbiased=False).item(),
        "train/grpo/advantage_mean": adv.mean().item(),
        "train/grpo/advantage_std": adv.std(unbiased=False).item(),
        "train/grpo/advantage_abs_max": adv.abs().max().item(),
        "train/grpo/valid_step_fraction": valid.float().mean().item(),
    }


def grpo_columns(part: GRPOSegment, cols: Sequence[int] | Tensor) -> GRPOSegment:
    """The env columns ``cols`` of a segment's GRPO quantities (a learner rank's share under DDP;
    groups are resolved on the whole segment first, so a shard never splits a group's statistics)."""
    c = torch.as_tensor(cols, dtype=torch.long, device=part.returns.device)
    return GRPOSegment(
        part.advantages[:, c],
        part.keep[:, c],
        part.returns[c],
        part.traj_advantages[c],
        part.group_kept[c],
        part.valid[:, c],
    )
