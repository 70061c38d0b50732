"""The learner's update: decoupled PPO for a stale fleet, with the advantage estimator registered
in rlfleet.algorithms.estimators (GAE, V-trace or GRPO). `Trainer.step` runs one learner step in
two readable parts:

1. `prepare`: a fixed-shape batch of every received row, prepared once with the pre-update policy
   (policy lag, old log-probs and values, the reference policy's log-probs, the estimator's
   advantages and returns) and a validity mask: rows older than `max_policy_lag` or left out by
   the estimator (GRPO: steps after an episode's end, filtered groups) are masked, not dropped;
2. `update(batch)`: epochs x minibatches of the clipped objective (Schulman et al. 2017; CleanRL's
   update is the model): ratio, clipped surrogate, value loss, entropy, KL to the reference, one
   optimiser step, every mean a masked one.

What differs between algorithms is chosen once, in `rlfleet.algorithms.objective.objective`;
the trainer asks the resulting `Objective` (which estimator, whether a critic trains) rather than
test the algorithm's name.

Under torchrun (rlfleet.learner.distributed) every rank runs the same step on its share of the
env columns (rlfleet.learner.sharding). DDP reaches `update` only as a weight mask and a loss
divisor per minibatch (`sharding.MinibatchMean`): each rank's loss is its sum over its rows of a
one-process minibatch divided by that minibatch's size over world_size, so DDP's gradient
average equals the one-process gradient.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from rlfleet.algorithms import (
    PPOConfig,
    bootstrap_next_values,
    explained_variance,
    group_mean_var,
    kl_to_reference,
    lag_mask,
    normalize_advantages,
    normalize_advantages_per_task,
    policy_lag,
    truncated_importance_weights,
)
from rlfleet.algorithms.estimators import AdvantageInputs, Advantages, advantage_stats, estimate
from rlfleet.algorithms.objective import objective
from rlfleet.algorithms.ppo import clipped_surrogate, clipped_value_error, update_loss
from rlfleet.algorithms.vtrace import chunk_log_ratio
from rlfleet.learner.distributed import Ranks, SingleRank, global_mean_var
from rlfleet.learner.metrics import policy_lag_counts
from rlfleet.learner.sharding import (
    MinibatchMean,
    RowShard,
    minibatch_rows,
    minibatch_size,
    segment_envs,
    shard_rows,
    whole_batch,
)
from rlfleet.policies.base import Policy
from rlfleet.policies.gaussian_mlp import RunningNorm
from rlfleet.wire.segment import Segment

Obs = dict[str, torch.Tensor]


@dataclass
class Batch:
    """Flattened [N] rows, fixed shape: every received row of this rank's env columns
    (log-probs [N, *logprob_shape]); ``valid`` marks the rows to train on."""

    obs: Obs
    actions: torch.Tensor
    extras: dict[str, torch.Tensor]
    logp_old: torch.Tensor
    is_weights: torch.Tensor
    values_old: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    lags: torch.Tensor
    logp_ref: torch.Tensor  # the reference (SFT) policy's log-prob; zeros without a KL penalty
    task_ids: torch.Tensor  # [N] the task of each row's env
    valid: torch.Tensor  # [N] bool: young enough (lag <= max_policy_lag) and kept by the estimator

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def select(self, idx: torch.Tensor) -> Batch:
        return Batch(**{f: _index(getattr(self, f), idx) for f in self.__dataclass_fields__})

    @staticmethod
    def cat(parts: list[Batch]) -> Batch:
        if len(parts) == 1:  # nothing to join: the rows as they are, not a copy
            return parts[0]
        return Batch(**{f: _cat([getattr(p, f) for p in parts]) for f in Batch.__dataclass_fields__})


# (lowest task id, per-task advantage mean, std): task k's statistics are at index k - lowest
TaskStats = tuple[int, torch.Tensor, torch.Tensor]


def _as_policy(module: nn.Module) -> Policy:
    """The module seen through the policy protocol: nn.Module's __getattr__ types a method it does
    not declare as Tensor | Module, so evaluate / value / update_normalization need this view."""
    return cast(Policy, module)


def _rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[idx] along the first dim. index_select for integer indices: the same rows, without advanced
    indexing's general path (4x cheaper for a minibatch of states on CPU, 20x for uint8 images)."""
    return x[idx] if idx.dtype == torch.bool else x.index_select(0, idx)


def _index(x: Any, idx: torch.Tensor) -> Any:
    return {k: _rows(v, idx) for k, v in x.items()} if isinstance(x, dict) else _rows(x, idx)


def _cat(xs: list[Any]) -> Any:
    if len(xs) == 1:
        return xs[0]
    return {k: torch.cat([x[k] for x in xs]) for k in xs[0]} if isinstance(xs[0], dict) else torch.cat(xs)


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[T, B, ...] -> [T*B, ...]"""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


# Per-minibatch statistics, averaged over minibatches (weighted by rows, so across ranks too).
MINIBATCH_STATS = (
    "train/actor/policy_loss",
    "train/actor/approx_kl",
    "train/actor/clip_fraction",
    "train/actor/dual_clip_fraction",
    "train/actor/grad_norm",
    "train/actor/entropy",
    "train/critic/value_loss",
    "train/critic/value_clip_ratio",
    "train/actor/kl_ref",
)


class PolicyEvaluator(nn.Module):
    """forward() = policy.evaluate, because DDP syncs the gradients of what runs through forward().

    What the loss does not use leaves detached: the log-prob and entropy without `train_actor`
    (critic warm-up), the value without `train_critic` (GRPO). DDP then finds those parameters
    unused and leaves their gradients empty, as one process does.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(
        self,
        obs: Obs,
        actions: torch.Tensor,
        extras: dict[str, torch.Tensor],
        train_actor: bool = True,
        train_critic: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logp, entropy, values = _as_policy(self.policy).evaluate(obs, actions, extras)
        if not train_actor:
            logp, entropy = logp.detach(), entropy.detach()
        if not train_critic:
            values = values.detach()
        return logp, entropy, values


def ppo_config(algorithm: DictConfig) -> PPOConfig:
    """The run config's `algorithm` section as the PPOConfig it is structured from."""
    cfg = OmegaConf.to_object(algorithm)
    if not isinstance(cfg, PPOConfig):
        raise TypeError(f"the algorithm section is a {type(cfg).__name__}, not a PPOConfig")
    return cfg


def _param_groups(policy: nn.Module, cfg: PPOConfig) -> list[dict[str, Any]]:
    """Trainable parameters; with `critic_lr` set, the value head (`policy.critic`) is its own group."""
    trainable = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    if cfg.critic_lr is None:
        return [{"params": [p for _, p in trainable], "name": "all"}]
    if not hasattr(policy, "critic"):
        raise ValueError(f"algorithm.critic_lr needs a policy with a `critic` head; {type(policy).__name__} has none")
    critic = [p for n, p in trainable if n.startswith("critic.")]
    rest = [p for n, p in trainable if not n.startswith("critic.")]
    return [{"params": rest, "name": "actor"}, {"params": critic, "name": "critic", "lr": cfg.critic_lr}]


def _read_keys(*policies: nn.Module | None) -> frozenset[str] | None:
    """The observation keys the policies read: a policy reads only its `obs_keys` (the Policy
    contract), so the other keys (images an MLP does not look at) are never copied or indexed.
    None when a policy does not say: then every key is kept."""
    keys: set[str] = set()
    for policy in policies:
        if policy is None:
            continue
        own = getattr(policy, "obs_keys", None)
        if own is None:
            return None
        keys.update(own)
    return frozenset(keys)


def _adam(groups: list[dict[str, Any]], lr: float) -> torch.optim.Adam:
    """Adam, with torch's fused kernel where every parameter allows it: one kernel per parameter
    instead of about ten tensor ops, the same update up to float rounding (about 4x cheaper per
    step for a small MLP on CPU)."""
    params = [p for g in groups for p in g["params"]]
    fused = bool(params) and all(torch.is_floating_point(p) and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(groups, lr=lr, eps=1e-5, fused=fused or None)


class Trainer:
    """The learner's update for PPO with GAE, PPO with V-trace and GRPO (module docstring)."""

    # Forward passes over a whole update's samples run in pieces of this many rows, so pixel
    # policies do not hold activations for thousands of images at once.
    EVAL_ROWS = 512

    def __init__(
        self,
        policy: nn.Module,
        cfg: PPOConfig,
        reward_scale: float = 1.0,
        device: str = "cpu",
        ranks: Ranks | None = None,
        reference: nn.Module | None = None,
        freeze_normalization: bool = False,
    ):
        self.policy = policy.to(device)
        # A policy that starts from a checkpoint (SFT) keeps its observation statistics: moving
        # them moves every action (docs/algorithms.md).
        self.freeze_normalization = freeze_normalization
        self.cfg = cfg
        # The one place the algorithm's pieces are chosen: estimator, critic or none, KL penalty.
        self.objective = objective(cfg)
        if self.objective.kl_to_reference and reference is None:
            raise ValueError("algorithm.kl_beta > 0 needs a reference policy (the SFT checkpoint)")
        # Frozen; only its log-probs are used (the KL penalty to the starting policy).
        self.reference = (
            reference.to(device).eval().requires_grad_(False)
            if reference is not None and self.objective.kl_to_reference
            else None
        )
        self.reward_scale = reward_scale
        self.device = device
        self.ranks = ranks or SingleRank()
        self.optimizer = _adam(_param_groups(policy, cfg), cfg.lr)
        self.obs_keys = _read_keys(self.policy, self.reference)
        self.updates = 0  # this process's updates, for the critic warm-up
        self.nonfinite_steps = 0  # optimiser steps skipped for a non-finite gradient (train/nonfinite_steps)
        self.last_account = (0, 0)  # the last step's env steps (trained, masked): env_step_account()
        self._model: nn.Module | None = None  # PolicyEvaluator, DDP-wrapped at the first update

    def _training_model(self) -> nn.Module:
        """Wrapped on first use, after rank 0 may have restored a checkpoint: DDP then broadcasts
        rank 0's weights, and rank 0's optimiser state follows, so every rank starts equal."""
        if self._model is None:
            # critic warm-up and a critic-free loss leave some parameters out (DDP must look for them)
            some_unused = self.cfg.critic_warmup_updates > 0 or not self.objective.critic
            self._model = self.ranks.wrap(PolicyEvaluator(self.policy), some_unused)
            self.ranks.sync_optimizer(self.optimizer)
        return self._model

    # --- tensors from segments and forward passes in pieces -------------------------------------

    def _t(self, arr: np.ndarray) -> torch.Tensor:
        """Copy: decoded segments are read-only views of the received bytes."""
        return torch.tensor(np.asarray(arr), device=self.device)

    def _obs(self, obs: dict[str, np.ndarray], flat: bool = True) -> Obs:
        """The observation keys the policies read, as tensors ([T*B, ...] when flat)."""
        return {k: _flat(self._t(v)) if flat else self._t(v) for k, v in obs.items() if self._reads(k)}

    def _reads(self, key: str) -> bool:
        return self.obs_keys is None or key in self.obs_keys

    def _extras(self, extras: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {k: _flat(self._t(v)) for k, v in extras.items()}

    def _evaluate(
        self, obs: Obs, actions: torch.Tensor, extras: dict[str, torch.Tensor], policy: nn.Module
    ) -> tuple[torch.Tensor, ...]:
        """policy.evaluate over many rows, in pieces of EVAL_ROWS."""
        n, outs = actions.shape[0], []
        for i in range(0, n, self.EVAL_ROWS):
            sl = slice(i, i + self.EVAL_ROWS)
            outs.append(
                _as_policy(policy).evaluate(
                    {k: v[sl] for k, v in obs.items()}, actions[sl], {k: v[sl] for k, v in extras.items()}
                )
            )
        return tuple(torch.cat(parts) for parts in zip(*outs))

    def _value(self, obs: Obs) -> torch.Tensor:
        n = next(iter(obs.values())).shape[0]
        parts = [
            _as_policy(self.policy).value({k: v[i : i + self.EVAL_ROWS] for k, v in obs.items()})
            for i in range(0, n, self.EVAL_ROWS)
        ]
        return torch.cat(parts) if parts else torch.zeros(0, device=self.device)

    # --- advantages -----------------------------------------------------------------------------

    def segment_advantages(self, segments: list[Segment]) -> list[Advantages] | None:
        """Advantages of whole segments from a critic-free estimator (GRPO; rewards after
        reward_scale), one per segment; None when the estimator needs the critic's values, which
        each rank computes on its own rows (`_prepare_segment`)."""
        if not self.objective.whole_segment_advantages:
            return None
        return [
            estimate(
                self.objective.estimator,
                AdvantageInputs(
                    self._t(seg.rewards) * self.reward_scale,
                    self._t(seg.terminated),
                    self._t(seg.truncated),
                    group_ids=self._t(seg.group_ids),
                ),
                self.cfg,
            )
            for seg in segments
        ]

    def _critic_inputs(self, seg: Segment, values: torch.Tensor) -> AdvantageInputs:
        """Rewards, episode ends and V(x_t), V(x_{t+1}) of one segment ([T, B]); ``log_rhos`` is
        filled in once the pre-update log-probs are corrected for policy lag."""
        terminated, truncated = self._t(seg.terminated), self._t(seg.truncated)
        if not self.cfg.bootstrap_truncated:  # the time limit is part of the task: its end is terminal
            terminated = terminated | truncated
        T, B = values.shape
        last_value = self._value(self._obs(seg.next_obs, flat=False))
        # The value of an episode's last observation only matters where it was truncated.
        final_values = torch.zeros(T * B, device=self.device)
        ended = (truncated & ~terminated).reshape(-1).nonzero().squeeze(-1)
        if len(ended):
            rows = ended.cpu().numpy()  # only these rows are copied (final_obs is all of [T, B], images too)
            final_obs = {
                k: self._t(np.asarray(v).reshape(T * B, *v.shape[2:])[rows])
                for k, v in seg.final_obs.items()
                if self._reads(k)
            }
            final_values[ended] = self._value(final_obs)
        next_values = bootstrap_next_values(values, last_value, terminated, truncated, final_values.reshape(T, B))
        rewards = self._t(seg.rewards) * self.reward_scale
        return AdvantageInputs(rewards, terminated, truncated, values, next_values)

    # --- prepare: a fixed-shape batch of every received row ---------------------------------------

    def valid_rows(
        self, segments: list[Segment], lags: list[torch.Tensor], advantages: list[Advantages] | None
    ) -> torch.Tensor:
        """[rows of all segments] bool, step-major per segment: young enough (lag <= max_policy_lag)
        and kept by a whole-segment estimator (GRPO: valid steps of kept groups)."""
        parts = []
        for j, (seg, lag) in enumerate(zip(segments, lags)):
            keep = lag_mask(lag, self.cfg.max_policy_lag).repeat_interleave(seg.num_envs)
            parts.append(keep if advantages is None else keep & advantages[j].keep.reshape(-1))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool, device=self.device)

    def prepare(self, segments: list[Segment], version: int) -> Batch:
        """One process's batch: every row of the segments, `valid` masking the rows to train on."""
        lags, advantages, valid = self._plan(segments, version)
        return self._prepare(segments, lags, advantages, shard_rows(segments, valid, 0, 1))

    def _plan(
        self, segments: list[Segment], version: int
    ) -> tuple[list[torch.Tensor], list[Advantages] | None, torch.Tensor]:
        """Each segment's step lags (computed once), the whole-segment advantages of critic-free
        estimators (GRPO: before sharding, every rank has all segments) and the rows to train on."""
        lags = [policy_lag(version, self._t(s.versions)) for s in segments]
        advantages = self.segment_advantages(segments)
        return lags, advantages, self.valid_rows(segments, lags, advantages)

    def _prepare(
        self, segments: list[Segment], lags: list[torch.Tensor], advantages: list[Advantages] | None, shard: RowShard
    ) -> Batch:
        """The shard's rows (its env columns of every segment, in one-process order), masked by the
        shard. ``lags``: each segment's step lags; ``advantages``: whole-segment estimates (None: the
        estimator runs here, on the pre-update policy's values)."""
        parts = []
        for j, cols in shard.parts:
            est = None if advantages is None else advantages[j].columns(cols)
            parts.append(self._prepare_segment(segment_envs(segments[j], cols), lags[j], est))
        batch = Batch.cat(parts)
        batch.valid = shard.local_valid()
        return batch

    @torch.no_grad()
    def _prepare_segment(self, seg: Segment, step_lags: torch.Tensor, est: Advantages | None) -> Batch:
        """Every row of one segment. ``est``: the segment's advantages when estimated before (whole
        segments); else the registered estimator runs here on the pre-update policy's values."""
        T, B = seg.num_steps, seg.num_envs
        obs = self._obs(seg.obs)
        actions = _flat(self._t(seg.actions))
        extras = self._extras(seg.extras)
        behaviour_logp = _flat(self._t(seg.logprobs))

        # Lag-0 rows were acted by these very weights: the inference server's log-probs and values
        # are what a forward pass here would give (the learner's recomputation equals them,
        # tests/integration/test_pixel_fleet.py), so only lagged rows run the pre-update policy.
        # Their importance weight is then exactly 1; lagged ones get min(pi_old / mu, rho_bar).
        lags = step_lags.repeat_interleave(B)
        logp_old = behaviour_logp.clone()
        values = _flat(self._t(seg.values)).float()
        stale = (lags != 0).nonzero().squeeze(-1)
        if len(stale) == len(lags):  # every row lagged: no copy of the observations
            logp_old, _, values = self._evaluate(obs, actions, extras, self.policy)
        elif len(stale):
            logp_stale, _, values_stale = self._evaluate(
                _index(obs, stale), actions[stale], _index(extras, stale), self.policy
            )
            logp_old[stale] = logp_stale.to(logp_old.dtype)
            values[stale] = values_stale.to(values.dtype)
        values = values.reshape(T, B)
        logp_ref = (
            self._evaluate(obs, actions, extras, self.reference)[0]
            if self.reference is not None
            else torch.zeros_like(logp_old)
        )
        is_weights = truncated_importance_weights(logp_old, behaviour_logp, self.cfg.rho_bar)
        if est is None:
            inputs = self._critic_inputs(seg, values)
            inputs.log_rhos = chunk_log_ratio(logp_old, behaviour_logp).reshape(T, B)
            est = estimate(self.objective.estimator, inputs, self.cfg)
        if est.importance_in_advantage:  # V-trace: rho_s is inside the advantage, so no weight
            is_weights = torch.ones_like(is_weights)
        return Batch(
            obs,
            actions,
            extras,
            logp_old,
            is_weights,
            values.reshape(-1),
            est.advantages.reshape(-1),
            est.returns.reshape(-1),
            lags,
            logp_ref,
            self._t(seg.task_ids).repeat(T),  # row t*B + b is env b's
            est.keep.reshape(-1),  # the shard's mask replaces it (`_prepare`)
        )

    # --- update: epochs x minibatches of the clipped objective -----------------------------------

    def update(self, batch: Batch, shard: RowShard | None = None) -> dict[str, float]:
        """Epochs x minibatches of one optimiser step on the clipped objective (Schulman et al. 2017).
        ``shard``: this rank's place in the one-process batch (None: one process, all of ``batch``)."""
        cfg, model = self.cfg, self._training_model()
        warmup = self.updates < cfg.critic_warmup_updates
        train_actor, train_critic = self.objective.trains(warmup)
        lr = self._set_lr()
        self.updates += 1
        stats = RowWeightedMeans()
        for mb, mean in self._minibatches(batch, shard or whole_batch(batch.valid, batch.task_ids)):
            logp, entropy, values = model(mb.obs, mb.actions, mb.extras, train_actor, train_critic)
            # policy: the clipped surrogate of the ratio to the pre-update policy, weighted by the
            # truncated importance weight of the stale behaviour policy (decoupled PPO)
            log_ratio = logp - mb.logp_old
            ratio = torch.exp(log_ratio)
            low, high = cfg.clip_ratio_low, cfg.clip_ratio_high
            pg, dual = clipped_surrogate(ratio, mb.advantages, low, high, cfg.dual_clip, mb.is_weights)
            # value: regression to the estimator's returns, clipped around the pre-update values
            v_error, v_clipped = clipped_value_error(values, mb.values_old, mb.returns, cfg.value_clip)
            kl = kl_to_reference(logp, mb.logp_ref) if self.reference is not None else None
            kl_ref = mean(kl) if kl is not None else None
            loss = update_loss(mean(pg), 0.5 * mean(v_error), mean(entropy), kl_ref, cfg, train_actor, train_critic)
            grad_norm = self._optimizer_step(loss)
            if grad_norm is not None and mean.rows:  # a skipped step (non-finite gradient) is not counted
                step = (mean, ratio, log_ratio, pg, dual, entropy, kl, v_error, v_clipped)
                stats.add(self._step_stats(*step, grad_norm), mean.rows)
        return {**stats.reduce(self.ranks, self.device), "train/critic_warmup": float(warmup), "train/lr": lr}

    @torch.no_grad()
    def _step_stats(
        self,
        mean: MinibatchMean,
        ratio: torch.Tensor,
        log_ratio: torch.Tensor,
        pg: torch.Tensor,
        dual: torch.Tensor,
        entropy: torch.Tensor,
        kl: torch.Tensor | None,
        v_error: torch.Tensor,
        v_clipped: torch.Tensor,
        grad_norm: float,
    ) -> dict[str, float]:
        """One step's statistics over this rank's counted rows (approx_kl: Schulman's k3 estimator),
        read out of the tensors at once (one copy, not one per statistic)."""
        outside = (ratio < 1.0 - self.cfg.clip_ratio_low) | (ratio > 1.0 + self.cfg.clip_ratio_high)
        means = {
            "train/actor/policy_loss": mean.local(pg),
            "train/actor/approx_kl": mean.local((ratio - 1.0) - log_ratio),
            "train/actor/entropy": mean.local(entropy),
        }
        counts = {"train/actor/clip_fraction": outside, "train/actor/dual_clip_fraction": dual}
        if kl is not None:
            means["train/actor/kl_ref"] = mean.local(kl)
        if self.objective.critic:
            means["train/critic/value_loss"] = 0.5 * mean.local(v_error)
            counts["train/critic/value_clip_ratio"] = v_clipped
        values = torch.stack([*means.values(), *(mean.count(f).double() for f in counts.values())]).tolist()
        stats = dict(zip(means, values[: len(means)]))
        for (key, flags), n in zip(counts.items(), values[len(means) :]):
            stats[key] = int(n) / mean.elements(flags)
        stats["train/actor/grad_norm"] = grad_norm
        return stats

    def _minibatches(self, batch: Batch, shard: RowShard) -> Iterator[tuple[Batch, MinibatchMean]]:
        """Each epoch's minibatches of this rank's rows, advantages whitened, with the mean its loss
        takes (every rank the same collectives: rank 0 draws each epoch's row order)."""
        task_stats = self._task_advantage_stats(batch, shard) if self.objective.normalize_per_task else None
        mb_size = minibatch_size(shard.num_rows, self.cfg.num_minibatches)
        for _ in range(self.cfg.update_epochs):
            order = self._shared_permutation(shard.num_rows)
            for rows, weight in minibatch_rows(shard, order, mb_size):
                mb = batch.select(rows)
                mb.advantages = self._whiten(mb, weight, task_stats)
                yield mb, MinibatchMean(weight, mb_size / shard.world_size)

    def _whiten(self, mb: Batch, weight: torch.Tensor, task_stats: TaskStats | None) -> torch.Tensor:
        """Advantages whitened with their task's statistics over the whole update, or with the
        whole minibatch's (all ranks), as the objective says."""
        if task_stats is not None:
            lo, task_mean, task_std = task_stats
            return normalize_advantages_per_task(mb.advantages, mb.task_ids - lo, stats=(task_mean, task_std))
        if self.objective.normalize_advantages:
            ((mean, var),) = global_mean_var(self.ranks, mb.advantages[weight])
            return normalize_advantages(mb.advantages, stats=(mean, var**0.5))
        return mb.advantages

    def _optimizer_step(self, loss: torch.Tensor) -> float | None:
        """Backward, clip, step; the first group's gradient norm, or None when a non-finite
        gradient made it skip the step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # Each group on its own: a separate critic group (critic_lr) must not be left unclipped, nor
        # shrink the actor's step when the value loss is large.
        norms = [clip_grad_norm(g["params"], self.cfg.max_grad_norm) for g in self.optimizer.param_groups]
        if not all(math.isfinite(n) for n in norms):  # a NaN/inf loss must never reach the weights (the
            # norm is of DDP's all-reduced gradients, so every rank skips the same steps)
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_steps += 1
            return None
        self.optimizer.step()
        return norms[0]

    def _shared_permutation(self, n: int) -> torch.Tensor:
        """Rank 0 draws the minibatch order (from its RNG, as one process would) and every rank uses it."""
        if self.ranks.is_main:
            perm = torch.randperm(n, device=self.device)
        else:
            perm = torch.empty(n, dtype=torch.long, device=self.device)
        return self.ranks.broadcast_(perm)

    # --- one learner step ---------------------------------------------------------------------------

    def step(self, segments: list[Segment], version: int) -> dict[str, float]:
        """One learner step on the given segments: prepare this rank's batch, update on it, move
        the observation normalisation; returns metrics.

        Under torchrun every rank calls it with the same segments (rank 0 broadcasts them) and
        trains on its shard; the returned metrics cover all ranks.
        """
        lags, advantages, valid = self._plan(segments, version)
        received = self._lag_stats(segments, lags)
        received.update(advantage_stats(advantages or [], [self._t(s.group_ids) for s in segments]))
        self.last_account = env_step_account(segments, valid)
        shard = shard_rows(segments, valid, self.ranks.rank, self.ranks.world_size)
        total = len(valid)
        if shard.num_rows == 0:
            return {"train/dropped_samples": float(total), **received}
        self._training_model()  # before prepare: a resumed run's weights reach every rank first
        batch = self._prepare(segments, lags, advantages, shard)
        out = self.update(batch, shard)
        # Whitening stats move after the update, so the log-probs above were computed with the
        # same normalisation the behaviour policy used (lag-0 ratios start at exactly 1).
        self._update_normalization(segments, batch, shard)
        out.update(self._batch_stats(batch))
        out.update(received)
        out["train/dropped_samples"] = float(total - shard.num_rows)
        out["train/nonfinite_steps"] = float(self.nonfinite_steps)
        norm = getattr(self.policy, "obs_norm", None)
        if isinstance(norm, RunningNorm):  # outliers kept out of the statistics
            out["train/obs_norm_rejected_rows"] = float(norm.rejected_rows)
            out["train/obs_norm_clipped_values"] = float(norm.clipped_values)
        out["train/samples"] = float(shard.num_rows)
        return out

    def _batch_stats(self, batch: Batch) -> dict[str, float]:
        """Rollout statistics over the whole update's valid rows (all ranks)."""
        v = batch.valid
        returns, values = batch.returns[v].double(), batch.values_old[v].double()
        (r_mean, r_var), (_, res_var), (adv_mean, _), (w_mean, _) = global_mean_var(
            self.ranks, returns, returns - values, batch.advantages[v], batch.is_weights[v]
        )
        ev = explained_variance(r_var, res_var)
        out = {"train/critic/explained_variance": ev} if self.objective.critic else {}  # no critic: nothing explained
        out.update(
            {"rollout/returns_mean": r_mean, "rollout/advantages_mean": adv_mean, "rollout/is_weight_mean": w_mean}
        )
        return out

    def _lag_stats(self, segments: list[Segment], lags: list[torch.Tensor]) -> dict[str, float]:
        """Policy lag over every received sample, the dropped ones included."""
        rows = torch.cat([lag.repeat_interleave(s.num_envs) for s, lag in zip(segments, lags)]).float()
        return {
            "throughput/policy_lag": rows.mean().item(),
            "throughput/policy_lag_max": rows.max().item(),
            **policy_lag_counts(rows.long().cpu().numpy(), self.cfg.max_policy_lag),
        }

    def lr_scale(self, update: int) -> float:
        """Linear warm-up (i+1)/N over the first N policy updates i; 1 during the critic warm-up."""
        i = update - self.cfg.critic_warmup_updates
        n = self.cfg.lr_warmup_updates
        return 1.0 if i < 0 or n == 0 else min(1.0, (i + 1) / n)

    def _set_lr(self) -> float:
        lr = self.cfg.lr * self.lr_scale(self.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.critic_lr if group.get("name") == "critic" else lr  # no name: saved before critic_lr
        return lr

    def _task_advantage_stats(self, batch: Batch, shard: RowShard) -> TaskStats:
        """Each task's advantage mean and std over the whole update's valid rows, every rank's
        (all ranks call it). Every rank holds the same segments' task ids, so the numbering agrees."""
        v = batch.valid
        lo, hi = shard.task_range
        mean, var = group_mean_var(batch.advantages[v], batch.task_ids[v] - lo, hi - lo + 1, self.ranks.all_reduce_)
        return lo, mean, var.sqrt()

    def _update_normalization(self, segments: list[Segment], batch: Batch, shard: RowShard) -> None:
        """Rank 0 moves the statistics over every valid row, in one-process order; the others copy them."""
        if self.freeze_normalization:
            return
        if self.ranks.is_main:
            whole = shard.world_size == 1  # the batch holds every row: no second copy of the observations
            obs = batch.obs if whole else _cat([self._obs(s.obs) for s in segments])
            rows = shard.valid.nonzero().squeeze(-1)
            _as_policy(self.policy).update_normalization(obs if len(rows) == len(shard.valid) else _index(obs, rows))
        self.ranks.broadcast_buffers(self.policy)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_ (2-norm) with the same foreach kernels in the same order, so
    the same bits, without its per-call grouping and checks (a quarter of a small MLP's minibatch
    step on CPU); parameters of several devices or dtypes go to torch's own. Returns the norm
    before clipping (NaN or inf when a gradient is not finite: nothing is then skipped here)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if len({(g.device, g.dtype) for g in grads}) > 1:
        return float(nn.utils.clip_grad_norm_(params, max_norm))
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return float(total)


def env_step_account(segments: list[Segment], valid: torch.Tensor) -> tuple[int, int]:
    """(env steps in trained rows, env steps in masked rows) of the segments. A segment counts only
    its total env steps, so each row gets its share (a row is a chunk of up to chunk_size steps);
    the two always add up to the segments' env steps."""
    trained = total = 0
    kept = valid.split([s.num_steps * s.num_envs for s in segments]) if segments else []
    for seg, keep in zip(segments, kept):
        steps, rows = int(seg.env_steps), len(keep)
        trained += steps * int(keep.sum()) // rows if rows else 0
        total += steps
    return trained, total - trained


class RowWeightedMeans:
    """Per-minibatch statistics, averaged over minibatches weighted by rows (so over ranks too)."""

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}

    def add(self, values: dict[str, float], rows: int) -> None:
        for key, val in values.items():
            acc = self.sums.setdefault(key, [0.0, 0.0])
            acc[0] += val * rows
            acc[1] += rows

    def reduce(self, ranks: Ranks, device: str) -> dict[str, float]:
        """The means over every rank's steps (one all-reduce, the same keys on every rank)."""
        sums = [x for k in MINIBATCH_STATS for x in self.sums.get(k, [0.0, 0.0])]
        totals = ranks.all_reduce_(torch.tensor(sums, dtype=torch.float64, device=device)).tolist()
        return {k: totals[2 * i] / totals[2 * i + 1] for i, k in enumerate(MINIBATCH_STATS) if totals[2 * i + 1] > 0}
