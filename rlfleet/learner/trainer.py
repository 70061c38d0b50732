"""The PPO update over a batch of trajectory segments (decoupled PPO for a stale fleet).

Reads top to bottom like the algorithm: refresh normalisation, compute old log-probs and
values with the pre-update policy, correct for policy lag, advantages, then minibatch epochs.
The advantage estimator is chosen by name (rlfleet.algorithms.estimators): `gae`, `vtrace`
(`algorithm.off_policy: vtrace`: V-trace targets and advantages instead of GAE and IS weights) or
`grpo` (`algorithm.adv_type: grpo`: group-relative advantages over whole-episode segments, no critic).

Under torchrun (see rlfleet.learner.distributed) every rank runs the same update on its share
of the env columns; minibatches are drawn over the one-process row order and each rank's loss is
scaled by its share of the minibatch, so DDP's gradient average equals the one-process gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlfleet.algorithms import (
    PPOConfig,
    bootstrap_next_values,
    kl_to_reference,
    lag_mask,
    normalize_advantages,
    policy_lag,
    policy_loss,
    ppo_total_loss,
    truncated_importance_weights,
    value_loss,
)
from rlfleet.algorithms.estimators import AdvantageInputs, estimate, estimator_name, from_grpo
from rlfleet.algorithms.grpo import GRPOSegment, grpo_columns, grpo_stats
from rlfleet.algorithms.vtrace import chunk_log_ratio
from rlfleet.learner.distributed import Ranks, RowShard, SingleRank, global_mean_var, segment_envs, shard_rows
from rlfleet.learner.metrics import policy_lag_counts
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

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def select(self, idx: torch.Tensor) -> Batch:
        return Batch(**{f: _index(getattr(self, f), idx) for f in self.__dataclass_fields__})

    @staticmethod
    def cat(parts: list[Batch]) -> Batch:
        return Batch(**{f: _cat([getattr(p, f) for p in parts]) for f in Batch.__dataclass_fields__})


def _index(x, idx: torch.Tensor):
    return {k: v[idx] for k, v in x.items()} if isinstance(x, dict) else x[idx]


def _cat(xs: list):
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
    ):
        logp, entropy, values = self.policy.evaluate(obs, actions, extras)
        if not train_actor:
            logp, entropy = logp.detach(), entropy.detach()
        if not train_critic:
            values = values.detach()
        return logp, entropy, values


def _param_groups(policy: nn.Module, cfg: PPOConfig) -> list[dict]:
    """Trainable parameters; with `critic_lr` set, the value head (`policy.critic`) is its own group."""
    trainable = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    if cfg.critic_lr is None:
        return [{"params": [p for _, p in trainable], "name": "all"}]
    if not hasattr(policy, "critic"):
        raise ValueError(f"algorithm.critic_lr needs a policy with a `critic` head; {type(policy).__name__} has none")
    critic = [p for n, p in trainable if n.startswith("critic.")]
    rest = [p for n, p in trainable if not n.startswith("critic.")]
    return [{"params": rest, "name": "actor"}, {"params": critic, "name": "critic", "lr": cfg.critic_lr}]


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
        # them moves every action (measured: KL 800 per step to the SFT MLP on RoboTwin).
        self.freeze_normalization = freeze_normalization
        if cfg.kl_beta > 0 and reference is None:
            raise ValueError("algorithm.kl_beta > 0 needs a reference policy (the SFT checkpoint)")
        # Frozen; only its log-probs are used (the KL penalty to the starting policy).
        self.reference = reference.to(device).eval().requires_grad_(False) if cfg.kl_beta > 0 else None
        self.cfg = cfg
        self.reward_scale = reward_scale
        self.device = device
        self.ranks = ranks or SingleRank()
        self.optimizer = torch.optim.Adam(_param_groups(policy, cfg), lr=cfg.lr, eps=1e-5)
        self.updates = 0  # this process's updates, for the critic warm-up
        self.nonfinite_steps = 0  # optimiser steps skipped for a non-finite gradient (train/nonfinite_steps)
        self.estimator = estimator_name(cfg)  # gae | vtrace | grpo (rlfleet.algorithms.estimators)
        self.grpo_mode = self.estimator == "grpo"  # critic-free group-relative advantages
        # GRPO is estimated on whole segments before DDP sharding (_grpo); rows without a group
        # (a rank's zero-weight stand-in row) go through the critic estimator.
        self.critic_estimator = "vtrace" if cfg.off_policy == "vtrace" else "gae"
        self._model: nn.Module | None = None  # PolicyEvaluator, DDP-wrapped at the first update

    def _training_model(self) -> nn.Module:
        """Wrapped on first use, after rank 0 may have restored a checkpoint: DDP then broadcasts
        rank 0's weights, and rank 0's optimiser state follows, so every rank starts equal."""
        if self._model is None:
            # critic warm-up and GRPO leave some parameters out of the loss (DDP must look for them)
            some_unused = self.cfg.critic_warmup_updates > 0 or self.grpo_mode
            self._model = self.ranks.wrap(PolicyEvaluator(self.policy), some_unused)
            self.ranks.sync_optimizer(self.optimizer)
        return self._model

    def _t(self, arr: np.ndarray) -> torch.Tensor:
        """Copy: decoded segments are read-only views of the received bytes."""
        return torch.tensor(np.asarray(arr), device=self.device)

    def _obs(self, obs: dict[str, np.ndarray], flat: bool = True) -> Obs:
        return {k: _flat(self._t(v)) if flat else self._t(v) for k, v in obs.items()}

    def _evaluate(
        self, obs: Obs, actions: torch.Tensor, extras: dict[str, torch.Tensor], policy: nn.Module | None = None
    ):
        """policy.evaluate (of the trained policy unless given) over many rows, in pieces of EVAL_ROWS."""
        n, outs = actions.shape[0], []
        for i in range(0, n, self.EVAL_ROWS):
            sl = slice(i, i + self.EVAL_ROWS)
            outs.append(
                (policy or self.policy).evaluate(
                    {k: v[sl] for k, v in obs.items()}, actions[sl], {k: v[sl] for k, v in extras.items()}
                )
            )
        return tuple(torch.cat(parts) for parts in zip(*outs))

    def _value(self, obs: Obs) -> torch.Tensor:
        n = next(iter(obs.values())).shape[0]
        parts = [
            self.policy.value({k: v[i : i + self.EVAL_ROWS] for k, v in obs.items()})
            for i in range(0, n, self.EVAL_ROWS)
        ]
        return torch.cat(parts) if parts else torch.zeros(0, device=self.device)

    @torch.no_grad()
    def _prepare_segment(self, seg: Segment, version: int, grpo: GRPOSegment | None = None) -> Batch:
        T, B = seg.num_steps, seg.num_envs
        obs = self._obs(seg.obs)
        actions = _flat(self._t(seg.actions))
        extras = self._obs(seg.extras)
        behaviour_logp = _flat(self._t(seg.logprobs))

        logp_old, _, values = self._evaluate(obs, actions, extras)
        values = values.reshape(T, B)
        logp_ref = (
            self._evaluate(obs, actions, extras, self.reference)[0]
            if self.reference is not None
            else torch.zeros_like(logp_old)
        )
        terminated, truncated = self._t(seg.terminated), self._t(seg.truncated)
        if not self.cfg.bootstrap_truncated:  # the time limit is part of the task: its end is terminal
            terminated = terminated | truncated
        if grpo is None:  # GRPO has no critic, so no bootstrap values
            last_value = self._value(self._obs(seg.next_obs, flat=False))
            # The value of an episode's last observation only matters where it was truncated.
            final_values = torch.zeros(T * B, device=self.device)
            ended = (truncated & ~terminated).reshape(-1).nonzero().squeeze(-1)
            if len(ended):
                final_values[ended] = self._value({k: _flat(self._t(v))[ended] for k, v in seg.final_obs.items()})
            final_values = final_values.reshape(T, B)

        # Off-policy correction: lag-0 samples use the behaviour log-prob itself, so their
        # importance weight is exactly 1; lagged ones get min(pi_old / mu, rho_bar).
        lags = policy_lag(version, self._t(seg.versions)).repeat_interleave(B)
        lag0 = _broadcast(lags == 0, logp_old)
        logp_old = torch.where(lag0, behaviour_logp, logp_old)
        is_weights = truncated_importance_weights(logp_old, behaviour_logp, self.cfg.rho_bar)

        rewards = self._t(seg.rewards) * self.reward_scale
        if grpo is not None:  # group-relative, estimated on the whole segment (_grpo)
            est = from_grpo(grpo)
        else:
            next_values = bootstrap_next_values(values, last_value, terminated, truncated, final_values)
            log_rhos = chunk_log_ratio(logp_old, behaviour_logp).reshape(T, B)
            est = estimate(
                self.critic_estimator,
                AdvantageInputs(rewards, terminated, truncated, values, next_values, log_rhos),
                self.cfg,
            )
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
        )

    def _grpo(self, seg: Segment) -> GRPOSegment:
        """GRPO advantages and kept rows of one whole segment (returns after reward_scale)."""
        inputs = AdvantageInputs(
            self._t(seg.rewards) * self.reward_scale,
            self._t(seg.terminated),
            self._t(seg.truncated),
            group_ids=self._t(seg.group_ids),
        )
        group = estimate("grpo", inputs, self.cfg).group
        assert group is not None  # the GRPO estimator always returns its groups
        return group

    def prepare(self, segments: list[Segment], version: int, grpo: list[GRPOSegment] | None = None) -> Batch:
        """Kept rows of the segments: lag <= max_policy_lag, and in GRPO mode the valid steps of kept
        groups (``grpo``: one per segment, computed here from the segments when not given)."""
        if grpo is None and self.grpo_mode:
            grpo = [self._grpo(s) for s in segments]
        batch = Batch.cat(
            [self._prepare_segment(s, version, g) for s, g in zip(segments, grpo or [None] * len(segments))]
        )
        keep = lag_mask(batch.lags, self.cfg.max_policy_lag)
        if grpo is not None:
            keep &= torch.cat([g.keep.reshape(-1) for g in grpo])
        return batch.select(keep.nonzero().squeeze(-1))

    def _prepare_shard(
        self, segments: list[Segment], shard: RowShard, version: int, grpo: list[GRPOSegment] | None = None
    ) -> tuple[Batch, Batch]:
        """This rank's rows, and one row to run through the model with zero weight when a
        minibatch has none of them (the loss must still reach every parameter, for DDP)."""
        parts = [segment_envs(segments[j], cols) for j, cols in shard.parts]
        sub = None if grpo is None else [grpo_columns(grpo[j], cols) for j, cols in shard.parts]
        batch = self.prepare(parts, version, sub) if parts else None
        if batch is not None and len(batch) != len(shard.row_ids):
            raise RuntimeError(f"rank {self.ranks.rank} prepared {len(batch)} rows, its shard has {len(shard.row_ids)}")
        if batch is not None and len(batch):
            return batch, batch.select(torch.zeros(1, dtype=torch.long, device=self.device))
        # No rows here (fewer env columns than ranks, or all too old): any row of the right shapes.
        stand_in = self._prepare_segment(segment_envs(segments[0], np.arange(1)), version)
        first = torch.zeros(1, dtype=torch.long, device=self.device)
        return (batch if batch is not None else stand_in.select(first[:0])), stand_in.select(first)

    def _shared_permutation(self, n: int) -> torch.Tensor:
        """Rank 0 draws the minibatch order (from its RNG, as one process would) and every rank uses it."""
        if self.ranks.is_main:
            perm = torch.randperm(n, device=self.device)
        else:
            perm = torch.empty(n, dtype=torch.long, device=self.device)
        return self.ranks.broadcast_(perm)

    def _kept_obs(self, segments: list[Segment], version: int, grpo: list[GRPOSegment] | None = None) -> Obs:
        """Observations of every kept row, in one-process order (rank 0's normalisation update)."""
        parts = []
        for j, seg in enumerate(segments):
            lags = policy_lag(version, self._t(seg.versions)).repeat_interleave(seg.num_envs)
            keep = lag_mask(lags, self.cfg.max_policy_lag)
            if grpo is not None:
                keep &= grpo[j].keep.reshape(-1)
            parts.append(_index(self._obs(seg.obs), keep.nonzero().squeeze(-1)))
        return _cat(parts)

    def _update_normalization(
        self, segments: list[Segment], batch: Batch, version: int, grpo: list[GRPOSegment] | None = None
    ) -> None:
        if self.freeze_normalization:
            return
        if self.ranks.world_size == 1:
            self.policy.update_normalization(batch.obs)
            return
        if self.ranks.is_main:
            self.policy.update_normalization(self._kept_obs(segments, version, grpo))
        self.ranks.broadcast_buffers(self.policy)

    def _minibatch_step(
        self, mb: Batch, mb_size: int, warmup: bool, sums: dict[str, list[float]], stand_in: Batch
    ) -> None:
        """One optimiser step on this rank's rows of a minibatch of `mb_size` rows (all ranks)."""
        n = len(mb)
        adv = mb.advantages
        if self.cfg.norm_adv and not self.grpo_mode:  # GRPO advantages are already normalised per group
            ((mean, var),) = global_mean_var(self.ranks, adv)
            adv = normalize_advantages(adv, stats=(mean, var**0.5))
        rows = mb if n else stand_in
        logp, entropy, values = self._training_model()(
            rows.obs, rows.actions, rows.extras, train_actor=not warmup, train_critic=warmup or not self.grpo_mode
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
            if warmup:  # the policy keeps its (SFT) weights until the critic has caught up
                loss = self.cfg.vf_coef * v_loss
            elif self.grpo_mode:  # critic-free: no value loss, the value head gets no gradient
                loss = pg_loss - self.cfg.ent_coef * entropy.mean()
            else:
                loss = ppo_total_loss(pg_loss, v_loss, entropy, self.cfg)
            kl_ref = kl_to_reference(logp, mb.logp_ref).mean() if self.reference is not None else logp.new_zeros(())
            if not warmup and self.reference is not None:
                loss = loss + self.cfg.kl_beta * kl_ref
            # A mean over this rank's n rows, weighted by its share: DDP's average over ranks is
            # then the mean over the whole minibatch.
            loss = loss * (self.ranks.world_size * n / mb_size)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # Each group on its own: a separate critic group (critic_lr) must not be left unclipped, nor
        # shrink the actor's step when the value loss is large. The first group's norm is reported.
        norms = [nn.utils.clip_grad_norm_(g["params"], self.cfg.max_grad_norm) for g in self.optimizer.param_groups]
        grad_norm = norms[0]
        if not all(torch.isfinite(n) for n in norms):  # a NaN/inf loss must never reach the weights (the
            # norm is of DDP's all-reduced gradients, so every rank skips the same steps)
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_steps += 1
            return
        if n:
            for key, val in zip(
                MINIBATCH_STATS,
                (
                    pg_loss.item(),
                    pg_stats["approx_kl"],
                    pg_stats["clip_fraction"],
                    pg_stats.get("dual_clip_fraction", 0.0),
                    float(grad_norm),
                    entropy.mean().item(),
                    v_loss.item(),
                    v_stats["value_clip_ratio"],
                    kl_ref.item(),
                ),
            ):
                if (self.grpo_mode and key.startswith("train/critic/")) or (
                    key == "train/actor/kl_ref" and self.reference is None
                ):
                    continue
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
        # 1 - Var[R - V] / Var[R] (see algorithms.explained_variance): undefined when Var[R] = 0
        ev = float("nan") if r_var == 0.0 or np.isnan(r_var) else 1.0 - res_var / r_var
        return {
            "train/critic/explained_variance": ev,
            "rollout/returns_mean": r_mean,
            "rollout/advantages_mean": adv_mean,
            "rollout/is_weight_mean": w_mean,
        }

    def lr_scale(self, update: int) -> float:
        """Linear warm-up (i+1)/N over the first N policy updates i; 1 during the critic warm-up."""
        i = update - self.cfg.critic_warmup_updates
        n = self.cfg.lr_warmup_updates
        return 1.0 if i < 0 or n == 0 else min(1.0, (i + 1) / n)

    def update(self, segments: list[Segment], version: int) -> dict[str, float]:
        """One PPO update (epochs x minibatches) on the given segments; returns metrics.

        Under torchrun every rank calls it with the same segments (rank 0 broadcasts them) and
        trains on its shard; the returned metrics cover all ranks.
        """
        total = sum(s.num_steps * s.num_envs for s in segments)
        lags = torch.cat(
            [policy_lag(version, self._t(s.versions)).repeat_interleave(s.num_envs) for s in segments]
        ).float()
        lag_stats = {
            "throughput/policy_lag": lags.mean().item(),
            "throughput/policy_lag_max": lags.max().item(),
            **policy_lag_counts(lags.long().cpu().numpy(), self.cfg.max_policy_lag),
        }
        # GRPO: groups are resolved on whole segments before any sharding (every rank has them all)
        grpo = [self._grpo(s) for s in segments] if self.grpo_mode else None
        if grpo is not None:
            lag_stats.update(grpo_stats(grpo, [self._t(s.group_ids) for s in segments]))
        shard = shard_rows(
            segments,
            version,
            self.cfg.max_policy_lag,
            self.ranks.rank,
            self.ranks.world_size,
            None if grpo is None else [g.keep.cpu().numpy() for g in grpo],
        )
        if shard.num_rows == 0:
            return {"train/dropped_samples": float(total), **lag_stats}
        self._training_model()  # before prepare: a resumed run's weights reach every rank first
        batch, stand_in = self._prepare_shard(segments, shard, version, grpo)
        mb_size = max(1, shard.num_rows // self.cfg.num_minibatches)
        # where[i]: the local position of one-process row i, or -1 where another rank holds it
        where = torch.full((shard.num_rows,), -1, dtype=torch.long, device=self.device)
        where[torch.as_tensor(shard.row_ids, device=self.device)] = torch.arange(len(batch), device=self.device)
        warmup = self.updates < self.cfg.critic_warmup_updates
        lr = self.cfg.lr * self.lr_scale(self.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.critic_lr if group.get("name") == "critic" else lr  # no name: saved before critic_lr
        self.updates += 1
        sums: dict[str, list[float]] = {}
        for _ in range(self.cfg.update_epochs):
            perm = self._shared_permutation(shard.num_rows)
            for start in range(0, shard.num_rows - mb_size + 1, mb_size):
                local = where[perm[start : start + mb_size]]
                self._minibatch_step(batch.select(local[local >= 0]), mb_size, warmup, sums, stand_in)
        # Whitening stats move after the update, so the log-probs above were computed with the
        # same normalisation the behaviour policy used (lag-0 ratios start at exactly 1).
        self._update_normalization(segments, batch, version, grpo)
        out = self._reduce_stats(sums)
        out.update(self._batch_stats(batch))
        if self.grpo_mode:  # no critic to explain anything
            out.pop("train/critic/explained_variance", None)
        out.update(lag_stats)  # over every received sample, the dropped ones included
        out["train/dropped_samples"] = float(total - shard.num_rows)
        out["train/critic_warmup"] = float(warmup)
        out["train/lr"] = lr
        out["train/nonfinite_steps"] = float(self.nonfinite_steps)
        norm = getattr(self.policy, "obs_norm", None)
        if isinstance(norm, nn.Module) and hasattr(norm, "rejected_rows"):  # outliers kept out of the statistics
            out["train/obs_norm_rejected_rows"] = float(norm.rejected_rows)
            out["train/obs_norm_clipped_values"] = float(norm.clipped_values)
        out["train/samples"] = float(shard.num_rows)
        return out
