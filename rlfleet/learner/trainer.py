"""The learner's update over a batch of trajectory segments: decoupled PPO for a stale fleet,
with the advantage estimator chosen by name (GAE, V-trace or GRPO).

`PPOTrainer.update` reads top to bottom like the algorithm:

1. whole-segment advantages for a critic-free estimator (GRPO's groups), before any sharding;
2. prepare this rank's rows with the pre-update policy: old log-probs, values, the reference
   policy's log-probs, the policy-lag correction, then the registered estimator
   (rlfleet.algorithms.estimators: one `Advantages` structure for every estimator);
3. epochs x minibatches of one optimiser step on `update_loss` (rlfleet.algorithms.ppo: clipped
   policy loss, value loss, entropy bonus, KL to the reference);
4. move the observation normalisation, reduce the metrics over ranks.

What differs between algorithms is chosen once, in `rlfleet.algorithms.objective.objective`;
the methods ask the resulting `Objective` (which estimator, whether a critic trains) rather than
test the algorithm's name.

Under torchrun (rlfleet.learner.distributed) every rank runs the same update on its share of the
env columns (rlfleet.learner.sharding): minibatches are drawn over the one-process row order and
each rank's loss is scaled by its share of the minibatch, so DDP's gradient average equals the
one-process gradient.
"""

from __future__ import annotations

import math
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
    policy_loss,
    truncated_importance_weights,
    value_loss,
)
from rlfleet.algorithms.estimators import AdvantageInputs, Advantages, advantage_stats, estimate
from rlfleet.algorithms.objective import objective
from rlfleet.algorithms.ppo import update_loss
from rlfleet.algorithms.vtrace import chunk_log_ratio
from rlfleet.learner.distributed import Ranks, SingleRank, global_mean_var
from rlfleet.learner.metrics import policy_lag_counts
from rlfleet.learner.sharding import (
    RowShard,
    loss_share,
    minibatch_rows,
    minibatch_size,
    segment_envs,
    shard_rows,
    stand_in_columns,
)
from rlfleet.policies.base import Policy
from rlfleet.policies.gaussian_mlp import RunningNorm
from rlfleet.wire.segment import Segment

Obs = dict[str, torch.Tensor]


@dataclass
class Batch:
    """Flattened [N] samples ready for minibatching (log-probs [N, *logprob_shape])."""

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


def _broadcast(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A chunk's advantage applies to each of its per-action or per-token log-probs."""
    return adv.reshape(adv.shape[0], *([1] * (like.dim() - 1)))


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


class PPOTrainer:
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

    # --- rows to train on -----------------------------------------------------------------------

    @torch.no_grad()
    def _prepare_segment(self, seg: Segment, version: int, est: Advantages | None = None) -> tuple[Batch, torch.Tensor]:
        """Every row of one segment, and the estimator's rows to keep ([T*B] bool). ``est``: the
        segment's advantages when estimated before (whole segments); else the registered estimator
        runs here on the pre-update policy's values."""
        T, B = seg.num_steps, seg.num_envs
        obs = self._obs(seg.obs)
        actions = _flat(self._t(seg.actions))
        extras = self._extras(seg.extras)
        behaviour_logp = _flat(self._t(seg.logprobs))

        # Lag-0 rows were acted by these very weights: the inference server's log-probs and values
        # are what a forward pass here would give (the learner's recomputation equals them,
        # tests/integration/test_pixel_fleet.py), so only lagged rows run the pre-update policy.
        # Their importance weight is then exactly 1; lagged ones get min(pi_old / mu, rho_bar).
        lags = policy_lag(version, self._t(seg.versions)).repeat_interleave(B)
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
        inputs = self._critic_inputs(seg, values) if est is None else None
        is_weights = truncated_importance_weights(logp_old, behaviour_logp, self.cfg.rho_bar)

        if inputs is not None:
            inputs.log_rhos = chunk_log_ratio(logp_old, behaviour_logp).reshape(T, B)
            est = estimate(self.objective.estimator, inputs, self.cfg)
        assert est is not None  # given, or estimated just above
        if est.importance_in_advantage:  # V-trace: rho_s is inside the advantage, so no weight
            is_weights = torch.ones_like(is_weights)
        batch = Batch(
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
        )
        return batch, est.keep.reshape(-1)

    def prepare(self, segments: list[Segment], version: int, advantages: list[Advantages] | None = None) -> Batch:
        """Kept rows of the segments: lag <= max_policy_lag and kept by the estimator (GRPO: valid
        steps of kept groups). ``advantages``: one per segment when estimated before; a critic-free
        estimator runs here on the given segments when not."""
        if advantages is None:
            advantages = self.segment_advantages(segments)
        parts = [
            self._prepare_segment(seg, version, None if advantages is None else advantages[j])
            for j, seg in enumerate(segments)
        ]
        batch = Batch.cat([b for b, _ in parts])
        keep = lag_mask(batch.lags, self.cfg.max_policy_lag) & _cat([k for _, k in parts])
        if bool(keep.all()):  # the usual case: every row kept, nothing to copy
            return batch
        return batch.select(keep.nonzero().squeeze(-1))

    def _prepare_shard(
        self, segments: list[Segment], shard: RowShard, version: int, advantages: list[Advantages] | None = None
    ) -> tuple[Batch, Batch]:
        """This rank's rows, and one row to run through the model with zero weight when a
        minibatch has none of them (the loss must still reach every parameter, for DDP).
        ``advantages``: the whole segments' from `segment_advantages` (None: each rank estimates its own)."""
        parts = [segment_envs(segments[j], cols) for j, cols in shard.parts]
        sub = None if advantages is None else [advantages[j].columns(cols) for j, cols in shard.parts]
        batch = self.prepare(parts, version, sub) if parts else None
        if batch is not None and len(batch) != len(shard.row_ids):
            raise RuntimeError(f"rank {self.ranks.rank} prepared {len(batch)} rows, its shard has {len(shard.row_ids)}")
        first = torch.zeros(1, dtype=torch.long, device=self.device)
        if batch is not None and len(batch):
            return batch, batch.select(first)
        # No rows here (fewer env columns than ranks, or all too old): any row of the right shapes.
        cols = stand_in_columns()
        est = None if advantages is None else advantages[0].columns(cols)
        stand_in, _ = self._prepare_segment(segment_envs(segments[0], cols), version, est)
        return (batch if batch is not None else stand_in.select(first[:0])), stand_in.select(first)

    def _kept_obs(self, segments: list[Segment], version: int, advantages: list[Advantages] | None = None) -> Obs:
        """Observations of every kept row, in one-process order (rank 0's normalisation update)."""
        parts = []
        for j, seg in enumerate(segments):
            lags = policy_lag(version, self._t(seg.versions)).repeat_interleave(seg.num_envs)
            keep = lag_mask(lags, self.cfg.max_policy_lag)
            if advantages is not None:
                keep &= advantages[j].keep.reshape(-1)
            parts.append(_index(self._obs(seg.obs), keep.nonzero().squeeze(-1)))
        return _cat(parts)

    # --- the update -----------------------------------------------------------------------------

    def _shared_permutation(self, n: int) -> torch.Tensor:
        """Rank 0 draws the minibatch order (from its RNG, as one process would) and every rank uses it."""
        if self.ranks.is_main:
            perm = torch.randperm(n, device=self.device)
        else:
            perm = torch.empty(n, dtype=torch.long, device=self.device)
        return self.ranks.broadcast_(perm)

    def _minibatch_step(
        self,
        mb: Batch,
        mb_size: int,
        warmup: bool,
        sums: dict[str, list[float]],
        stand_in: Batch,
        task_stats: TaskStats | None = None,
    ) -> None:
        """One optimiser step on this rank's rows of a minibatch of `mb_size` rows (all ranks).
        ``task_stats``: whiten the advantages with their task's statistics over the whole update."""
        n = len(mb)
        adv = mb.advantages
        if task_stats is not None:
            lo, task_mean, task_std = task_stats
            adv = normalize_advantages_per_task(adv, mb.task_ids - lo, stats=(task_mean, task_std))
        elif self.objective.normalize_advantages:  # over the whole minibatch, all ranks
            ((mean, var),) = global_mean_var(self.ranks, adv)
            adv = normalize_advantages(adv, stats=(mean, var**0.5))
        train_actor, train_critic = self.objective.trains(warmup)
        rows = mb if n else stand_in
        logp, entropy, values = self._training_model()(
            rows.obs, rows.actions, rows.extras, train_actor=train_actor, train_critic=train_critic
        )
        if n == 0:  # still a backward pass: DDP needs every rank in every gradient all-reduce
            loss = 0.0 * (logp.sum() + entropy.sum() + values.sum())
        else:
            pg_loss, pg_stats = policy_loss(
                logp,
                mb.logp_old,
                _broadcast(adv, logp),
                self.cfg.clip_ratio_low,
                self.cfg.clip_ratio_high,
                self.cfg.dual_clip,
                weights=mb.is_weights,
            )
            v_loss, v_stats = value_loss(values, mb.values_old, mb.returns, self.cfg.value_clip)
            kl_ref = kl_to_reference(logp, mb.logp_ref).mean() if self.reference is not None else None
            loss = update_loss(pg_loss, v_loss, entropy, kl_ref, self.cfg, train_actor, train_critic)
            # A mean over this rank's n rows, weighted by its share: DDP's average over ranks is
            # then the mean over the whole minibatch.
            loss = loss * loss_share(self.ranks.world_size, n, mb_size)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # Each group on its own: a separate critic group (critic_lr) must not be left unclipped, nor
        # shrink the actor's step when the value loss is large. The first group's norm is reported.
        norms = [
            float(nn.utils.clip_grad_norm_(g["params"], self.cfg.max_grad_norm)) for g in self.optimizer.param_groups
        ]
        if not all(math.isfinite(n) for n in norms):  # a NaN/inf loss must never reach the weights (the
            # norm is of DDP's all-reduced gradients, so every rank skips the same steps)
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_steps += 1
            return
        if n:
            stats = {
                "train/actor/policy_loss": pg_loss.item(),
                "train/actor/approx_kl": pg_stats["approx_kl"],
                "train/actor/clip_fraction": pg_stats["clip_fraction"],
                "train/actor/dual_clip_fraction": pg_stats.get("dual_clip_fraction", 0.0),
                "train/actor/grad_norm": norms[0],
                "train/actor/entropy": entropy.mean().item(),
            }
            if self.objective.critic:
                stats["train/critic/value_loss"] = v_loss.item()
                stats["train/critic/value_clip_ratio"] = v_stats["value_clip_ratio"]
            if kl_ref is not None:
                stats["train/actor/kl_ref"] = kl_ref.item()
            for key, val in stats.items():
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0] += val * n
                acc[1] += n
        self.optimizer.step()

    def _reduce_stats(self, sums: dict[str, list[float]]) -> dict[str, float]:
        flat = torch.tensor(
            [x for k in MINIBATCH_STATS for x in sums.get(k, [0.0, 0.0])], dtype=torch.float64, device=self.device
        )
        totals = self.ranks.all_reduce_(flat).tolist()
        return {k: totals[2 * i] / totals[2 * i + 1] for i, k in enumerate(MINIBATCH_STATS) if totals[2 * i + 1] > 0}

    def _batch_stats(self, batch: Batch) -> dict[str, float]:
        """Rollout statistics over the whole update's kept rows (all ranks)."""
        returns, values = batch.returns.double(), batch.values_old.double()
        (r_mean, r_var), (_, res_var), (adv_mean, _), (w_mean, _) = global_mean_var(
            self.ranks, returns, returns - values, batch.advantages, batch.is_weights
        )
        ev = explained_variance(r_var, res_var)
        out = {"train/critic/explained_variance": ev} if self.objective.critic else {}  # no critic: nothing explained
        out.update(
            {"rollout/returns_mean": r_mean, "rollout/advantages_mean": adv_mean, "rollout/is_weight_mean": w_mean}
        )
        return out

    def _lag_stats(self, segments: list[Segment], version: int) -> dict[str, float]:
        """Policy lag over every received sample, the dropped ones included."""
        lags = torch.cat(
            [policy_lag(version, self._t(s.versions)).repeat_interleave(s.num_envs) for s in segments]
        ).float()
        return {
            "throughput/policy_lag": lags.mean().item(),
            "throughput/policy_lag_max": lags.max().item(),
            **policy_lag_counts(lags.long().cpu().numpy(), self.cfg.max_policy_lag),
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

    def update(self, segments: list[Segment], version: int) -> dict[str, float]:
        """One update (epochs x minibatches) on the given segments; returns metrics.

        Under torchrun every rank calls it with the same segments (rank 0 broadcasts them) and
        trains on its shard; the returned metrics cover all ranks.
        """
        total = sum(s.num_steps * s.num_envs for s in segments)
        received = self._lag_stats(segments, version)
        # Critic-free estimators (GRPO) run on whole segments, before sharding (every rank has them all).
        advantages = self.segment_advantages(segments)
        received.update(advantage_stats(advantages or [], [self._t(s.group_ids) for s in segments]))
        row_masks = None if advantages is None else [a.keep.cpu().numpy() for a in advantages]
        shard = shard_rows(
            segments, version, self.cfg.max_policy_lag, self.ranks.rank, self.ranks.world_size, row_masks
        )
        if shard.num_rows == 0:
            return {"train/dropped_samples": float(total), **received}
        self._training_model()  # before prepare: a resumed run's weights reach every rank first
        batch, stand_in = self._prepare_shard(segments, shard, version, advantages)
        task_stats = self._task_advantage_stats(batch, segments) if self.objective.normalize_per_task else None
        mb_size = minibatch_size(shard.num_rows, self.cfg.num_minibatches)
        where = shard.local_positions(self.device)
        warmup = self.updates < self.cfg.critic_warmup_updates
        lr = self._set_lr()
        self.updates += 1
        sums: dict[str, list[float]] = {}
        for _ in range(self.cfg.update_epochs):
            perm = self._shared_permutation(shard.num_rows)
            for local in minibatch_rows(where, perm, mb_size):
                self._minibatch_step(batch.select(local), mb_size, warmup, sums, stand_in, task_stats)
        # Whitening stats move after the update, so the log-probs above were computed with the
        # same normalisation the behaviour policy used (lag-0 ratios start at exactly 1).
        self._update_normalization(segments, batch, version, advantages)
        out = self._reduce_stats(sums)
        out.update(self._batch_stats(batch))
        out.update(received)
        out["train/dropped_samples"] = float(total - shard.num_rows)
        out["train/critic_warmup"] = float(warmup)
        out["train/lr"] = lr
        out["train/nonfinite_steps"] = float(self.nonfinite_steps)
        norm = getattr(self.policy, "obs_norm", None)
        if isinstance(norm, RunningNorm):  # outliers kept out of the statistics
            out["train/obs_norm_rejected_rows"] = float(norm.rejected_rows)
            out["train/obs_norm_clipped_values"] = float(norm.clipped_values)
        out["train/samples"] = float(shard.num_rows)
        return out

    def _task_advantage_stats(self, batch: Batch, segments: list[Segment]) -> TaskStats:
        """Each task's advantage mean and std over the whole update, every rank's rows (all ranks
        call it). Every rank holds the same segments, so the task numbering (shifted to 0) agrees."""
        ids = [s.task_ids for s in segments if s.num_envs]
        lo, hi = min(int(t.min()) for t in ids), max(int(t.max()) for t in ids)
        mean, var = group_mean_var(batch.advantages, batch.task_ids - lo, hi - lo + 1, self.ranks.all_reduce_)
        return lo, mean, var.sqrt()

    def _update_normalization(
        self, segments: list[Segment], batch: Batch, version: int, advantages: list[Advantages] | None
    ) -> None:
        if self.freeze_normalization:
            return
        if self.ranks.world_size == 1:
            _as_policy(self.policy).update_normalization(batch.obs)
            return
        if self.ranks.is_main:
            _as_policy(self.policy).update_normalization(self._kept_obs(segments, version, advantages))
        self.ranks.broadcast_buffers(self.policy)
