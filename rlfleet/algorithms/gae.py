"""Generalised Advantage Estimation (Schulman et al. 2016, "High-Dimensional
Continuous Control Using Generalized Advantage Estimation", sec. 3).

Layout: every tensor is time-major, ``[T, B]`` (T steps of a rollout, B
parallel environments).  Bootstrapping is made explicit through
``next_values``: the caller (or :func:`bootstrap_next_values`) decides what
V(s_{t+1}) is for each step, so a single reverse loop handles ordinary steps,
terminations (no bootstrap) and time-limit truncations (bootstrap from the
value of the final, pre-reset observation; Pardo et al. 2018, "Time Limits in
Reinforcement Learning").
"""

from __future__ import annotations

import torch
from torch import Tensor


def bootstrap_next_values(
    values: Tensor,
    last_value: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    final_values: Tensor,
) -> Tensor:
    """Build ``next_values[t] = V(s_{t+1})`` as seen from step t.

    Why: with auto-resetting vector envs, ``values[t+1]`` after an episode end
    is the value of the *next episode's* first obs, which must not be used.

        next_values[t] = values[t+1]            for t < T-1
        next_values[T-1] = last_value           (value of the obs after the rollout)
        next_values[t] = 0                      where terminated[t]
        next_values[t] = final_values[t]        where truncated[t] & ~terminated[t]

    Args:
        values: ``[T, B]`` V(s_t) for every step.
        last_value: ``[B]`` V(s_T), the obs following the last step.
        terminated: ``[T, B]`` bool/0-1, true terminal state reached after step t.
        truncated: ``[T, B]`` bool/0-1, episode cut by a time limit after step t.
        final_values: ``[T, B]`` V(final pre-reset obs); only read where truncated.
    """
    if values.dim() != 2:
        raise ValueError(f"values must be [T, B], got shape {tuple(values.shape)}")
    if last_value.shape != values.shape[1:]:
        raise ValueError(f"last_value must be [B]={tuple(values.shape[1:])}, got {tuple(last_value.shape)}")
    for name, t in (("terminated", terminated), ("truncated", truncated), ("final_values", final_values)):
        if t.shape != values.shape:
            raise ValueError(f"{name} must have shape {tuple(values.shape)}, got {tuple(t.shape)}")

    next_values = torch.cat([values[1:], last_value.unsqueeze(0).to(values.dtype)], dim=0)
    term = terminated.bool()
    trunc = truncated.bool() & ~term
    next_values = torch.where(trunc, final_values.to(values.dtype), next_values)
    next_values = torch.where(term, torch.zeros_like(next_values), next_values)
    return next_values


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    dones: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lambda) advantages and lambda-returns (Schulman et al. 2016).

        delta_t = r_t + gamma * next_values_t - V_t
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   A_T = 0
        returns = A + V                     (the TD(lambda) value target)

    ``done_t`` (termination *or* truncation after step t) only cuts the
    recursion; whether to bootstrap is already encoded in ``next_values``
    (0 for terminated, V(final obs) for truncated), see
    :func:`bootstrap_next_values`.

    Args:
        rewards, values, next_values: ``[T, B]`` floats.
        dones: ``[T, B]`` bool or float.
        gamma: discount. lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, both ``[T, B]``, no gradient.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [T, B], got shape {tuple(rewards.shape)}")
    for name, x in (("values", values), ("next_values", next_values), ("dones", dones)):
        if x.shape != rewards.shape:
            raise ValueError(f"{name} must have shape {tuple(rewards.shape)}, got {tuple(x.shape)}")

    with torch.no_grad():
        rewards = rewards.float() if not rewards.is_floating_point() else rewards
        values = values.to(rewards.dtype)
        next_values = next_values.to(rewards.dtype)
        not_done = 1.0 - dones.to(rewards.dtype)

        T = rewards.shape[0]
        # Everything but the recursion at once (element by element the same operations in the
        # same order as per step), so the loop over t runs two ops instead of six.
        deltas = rewards + gamma * next_values - values
        decay = gamma * lam * not_done
        advantages = torch.empty_like(rewards)
        last_adv = torch.zeros_like(rewards[0])
        for t in reversed(range(T)):
            last_adv = torch.add(deltas[t], decay[t] * last_adv, out=advantages[t])
        returns = advantages + values
    return advantages, returns
