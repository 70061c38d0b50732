"""Advantage estimators, registered by name with their traits: one registry, one result structure.

    gae     GAE(gamma, lambda) advantages and lambda-returns (rlfleet.algorithms.gae); the policy
            loss then weights each sample by its truncated importance weight min(pi_old/mu, rho_bar)
    vtrace  IMPALA's V-trace targets and advantages (rlfleet.algorithms.vtrace); the importance
            ratio is inside the advantage, so the loss weight is 1
    grpo    group-relative advantages over whole-episode segments, no critic
            (rlfleet.algorithms.grpo); trains only on valid steps of kept groups

Every estimator takes one segment's time-major ``[T, B]`` tensors (:class:`AdvantageInputs`) and
returns :class:`Advantages`. :func:`register_estimator` records each with its traits
(:class:`EstimatorSpec`: critic needed, whole-episode segments, own normalisation), RLinf-style;
the learner, the actors and the config checks ask the traits (:func:`spec`, :func:`episode_schedule`),
never the name. The run's estimator comes from the config with :func:`estimator_name`
(``algorithm.adv_type`` and ``algorithm.off_policy``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from rlfleet.algorithms.gae import compute_gae
from rlfleet.algorithms.grpo import (
    GRPOSegment,
    check_stage_rows,
    episode_rollout_len,
    grpo_columns,
    grpo_segment,
    grpo_stats,
)
from rlfleet.algorithms.vtrace import vtrace

if TYPE_CHECKING:
    from rlfleet.algorithms.ppo import PPOConfig


@dataclass
class AdvantageInputs:
    """One segment, ``[T, B]`` time-major; rewards already scaled. A critic-free estimator (GRPO)
    needs no values; V-trace needs ``log_rhos``; GRPO needs ``group_ids`` (``[B]``)."""

    rewards: Tensor
    terminated: Tensor  # bool; with bootstrap_truncated false, truncations are folded in
    truncated: Tensor  # bool
    values: Tensor | None = None  # V(x_t) under the pre-update policy
    next_values: Tensor | None = None  # V(x_{t+1}): 0 after termination (rlfleet.algorithms.gae.bootstrap_next_values)
    log_rhos: Tensor | None = None  # log(pi_old / mu) per step (rlfleet.algorithms.vtrace.chunk_log_ratio)
    group_ids: Tensor | None = None  # [B] group label of each env column


@dataclass
class Advantages:
    """What every estimator returns."""

    advantages: Tensor  # [T, B]
    returns: Tensor  # [T, B] the critic's targets (GRPO: each step's trajectory return; no critic trains on it)
    keep: Tensor  # [T, B] bool: rows to train on
    importance_in_advantage: bool  # True: the off-policy ratio is already inside (V-trace): loss weight 1
    group: GRPOSegment | None = None  # GRPO's per-trajectory quantities (diagnostics, DDP column shares)

    def columns(self, cols: Sequence[int] | np.ndarray) -> Advantages:
        """The env columns ``cols`` (a learner rank's share under DDP). Estimated on the whole
        segment first, a shard never splits a group's statistics."""
        c = torch.as_tensor(np.asarray(cols), dtype=torch.long, device=self.advantages.device)
        return Advantages(
            self.advantages[:, c],
            self.returns[:, c],
            self.keep[:, c],
            self.importance_in_advantage,
            None if self.group is None else grpo_columns(self.group, c),
        )


Estimator = Callable[[AdvantageInputs, "PPOConfig"], Advantages]


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator and what the rest of the update needs to know about it."""

    name: str
    fn: Estimator
    # Needs V(x_t): each learner rank runs it on its rows' pre-update values. Without a critic it
    # runs on the rewards alone, on whole segments before DDP sharding (a GRPO group's statistics
    # need all its members), and no value head trains.
    critic: bool
    # Segments hold whole episodes of env groups reset alike (the actors' episode schedule).
    whole_episodes: bool
    # The advantages come normalised (GRPO: per group), so no minibatch or per-task whitening.
    normalised: bool


ESTIMATORS: dict[str, EstimatorSpec] = {}


def register_estimator(
    name: str, *, critic: bool = True, whole_episodes: bool = False, normalised: bool = False
) -> Callable[[Estimator], Estimator]:
    """Decorator: register ``fn`` as the estimator ``name`` with its traits."""

    def decorator(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = EstimatorSpec(name, fn, critic, whole_episodes, normalised)
        return fn

    return decorator


def spec(name: str) -> EstimatorSpec:
    """The estimator registered as ``name`` (a one-line ValueError naming the known ones)."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r} (known: {', '.join(sorted(ESTIMATORS))})") from None


def _need(x: Tensor | None, what: str, name: str) -> Tensor:
    if x is None:
        raise ValueError(f"the {name} estimator needs {what}")
    return x


@register_estimator("gae")
def gae_estimator(inputs: AdvantageInputs, cfg: PPOConfig) -> Advantages:
    values = _need(inputs.values, "values", "gae")
    next_values = _need(inputs.next_values, "next_values", "gae")
    advantages, returns = compute_gae(
        inputs.rewards, values, next_values, inputs.terminated | inputs.truncated, cfg.gamma, cfg.gae_lambda
    )
    return Advantages(advantages, returns, torch.ones_like(advantages, dtype=torch.bool), False)


@register_estimator("vtrace")
def vtrace_estimator(inputs: AdvantageInputs, cfg: PPOConfig) -> Advantages:
    values = _need(inputs.values, "values", "vtrace")
    next_values = _need(inputs.next_values, "next_values", "vtrace")
    log_rhos = _need(inputs.log_rhos, "log_rhos", "vtrace")
    returns, advantages = vtrace(
        log_rhos,
        inputs.rewards,
        values,
        next_values,
        inputs.terminated | inputs.truncated,
        cfg.gamma,
        cfg.rho_bar,
        cfg.vtrace_c_bar,
        cfg.gae_lambda,
    )
    return Advantages(advantages, returns, torch.ones_like(advantages, dtype=torch.bool), True)


@register_estimator("grpo", critic=False, whole_episodes=True, normalised=True)
def grpo_estimator(inputs: AdvantageInputs, cfg: PPOConfig) -> Advantages:
    group_ids = _need(inputs.group_ids, "group_ids", "grpo")
    part = grpo_segment(inputs.rewards, inputs.terminated, inputs.truncated, group_ids, cfg.group_filter)
    return from_grpo(part)


def from_grpo(part: GRPOSegment) -> Advantages:
    """GRPO's segment quantities (possibly a DDP rank's columns of them) as Advantages."""
    T = part.advantages.shape[0]
    return Advantages(part.advantages, part.returns.unsqueeze(0).expand(T, -1), part.keep, False, part)


@dataclass(frozen=True)
class EpisodeSchedule:
    """What the run's estimator asks of the actors' segments: the one place roles learn it."""

    segment_len: int  # chunk steps per segment
    group_size: int  # 0: envs reset independently; else groups of this many envs reset to one seed


def episode_schedule(algorithm: Any, env: Any, actor: Any) -> EpisodeSchedule:
    """The schedule of a run's `algorithm`, `env` and `actor` sections (config objects): rollout_len
    chunk steps, or whole episodes in whole groups per pipeline stage (one-line ValueErrors)."""
    if not spec(estimator_name(algorithm)).whole_episodes:
        return EpisodeSchedule(int(actor.rollout_len), 0)
    terminate = bool(getattr(env, "terminate_on_success", False))
    steps = episode_rollout_len(int(env.max_episode_steps), int(env.chunk_size), terminate)
    check_stage_rows(int(actor.num_envs), int(actor.pipeline_stage_num), int(algorithm.group_size))
    return EpisodeSchedule(steps, int(algorithm.group_size))


def estimator_name(cfg: PPOConfig) -> str:
    """The run's estimator: ``off_policy: vtrace`` replaces GAE by V-trace; else ``adv_type`` names it."""
    return "vtrace" if cfg.adv_type == "gae" and cfg.off_policy == "vtrace" else cfg.adv_type


def check_estimator(cfg: PPOConfig) -> None:
    """The config's estimator options, checked against the registry and the estimator's traits
    (PPOConfig's own check; one-line ValueErrors)."""
    if cfg.adv_type not in ESTIMATORS or cfg.adv_type == "vtrace":
        known = sorted(n for n in ESTIMATORS if n != "vtrace")
        raise ValueError(f"adv_type must be {' or '.join(map(repr, known))}, got {cfg.adv_type!r}")
    if cfg.off_policy not in ("truncated_is", "vtrace"):
        raise ValueError(f"off_policy must be 'truncated_is' or 'vtrace', got {cfg.off_policy!r}")
    est = ESTIMATORS[cfg.adv_type]
    if cfg.norm_adv_per_task and (not cfg.norm_adv or est.normalised):
        raise ValueError(
            f"norm_adv_per_task needs norm_adv and an estimator that does not normalise its own ({cfg.adv_type!r} does)"
        )
    if est.whole_episodes and cfg.group_size < 2:
        raise ValueError(f"group_size must be >= 2 for {cfg.adv_type!r}, got {cfg.group_size}")
    if not est.critic and cfg.off_policy == "vtrace":
        raise ValueError(f"off_policy=vtrace needs a critic; {cfg.adv_type!r} has none (use truncated_is)")
    if not est.critic and cfg.critic_warmup_updates:
        raise ValueError(f"critic_warmup_updates must be 0 with {cfg.adv_type!r}: there is no critic to warm up")


def estimate(name: str, inputs: AdvantageInputs, cfg: PPOConfig) -> Advantages:
    """Run the estimator registered as ``name``."""
    est = spec(name)
    out = est.fn(inputs, cfg)
    # The learner draws minibatches over rows it knows to be valid on every rank before any
    # critic runs, so only a critic-free (whole-segment) estimator may leave rows out.
    if est.critic and not bool(out.keep.all()):
        raise ValueError(f"the {name} estimator needs a critic, so it must keep every row")
    return out


def advantage_stats(parts: Sequence[Advantages], group_ids: Sequence[Tensor]) -> dict[str, float]:
    """Per-update diagnostics of the estimator over every received segment: GRPO's group
    statistics (``train/grpo/*``, :func:`rlfleet.algorithms.grpo.grpo_stats`); none for the others."""
    groups = [p.group for p in parts if p.group is not None]
    return grpo_stats(groups, group_ids) if groups and len(groups) == len(parts) else {}
