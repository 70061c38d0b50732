"""The PPO update over a batch of trajectory segments (decoupled PPO for a stale fleet).

Reads top to bottom like the algorithm: refresh normalisation, compute old log-probs and
values with the pre-update policy, correct for policy lag, GAE, then minibatch epochs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlfleet.algorithms import (
    PPOConfig,
    bootstrap_next_values,
    compute_gae,
    explained_variance,
    lag_mask,
    normalize_advantages,
    policy_lag,
    policy_loss,
    ppo_total_loss,
    truncated_importance_weights,
    value_loss,
)
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

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def select(self, idx: torch.Tensor) -> "Batch":
        return Batch(**{f: _index(getattr(self, f), idx) for f in self.__dataclass_fields__})

    @staticmethod
    def cat(parts: list["Batch"]) -> "Batch":
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


class PPOTrainer:
    # Forward passes over a whole update's samples run in pieces of this many rows, so pixel
    # policies do not hold activations for thousands of images at once.
    EVAL_ROWS = 512

    def __init__(self, policy: nn.Module, cfg: PPOConfig, reward_scale: float = 1.0, device: str = "cpu"):
        self.policy = policy.to(device)
        self.cfg = cfg
        self.reward_scale = reward_scale
        self.device = device
        params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)
        self.updates = 0  # this process's updates, for the critic warm-up

    def _t(self, arr: np.ndarray) -> torch.Tensor:
        """Copy: decoded segments are read-only views of the received bytes."""
        return torch.tensor(np.asarray(arr), device=self.device)

    def _obs(self, obs: dict[str, np.ndarray], flat: bool = True) -> Obs:
        return {k: _flat(self._t(v)) if flat else self._t(v) for k, v in obs.items()}

    def _evaluate(self, obs: Obs, actions: torch.Tensor, extras: dict[str, torch.Tensor]):
        """policy.evaluate over many rows, in pieces of EVAL_ROWS."""
        n, outs = actions.shape[0], []
        for i in range(0, n, self.EVAL_ROWS):
            sl = slice(i, i + self.EVAL_ROWS)
            outs.append(self.policy.evaluate({k: v[sl] for k, v in obs.items()}, actions[sl],
                                             {k: v[sl] for k, v in extras.items()}))
        return tuple(torch.cat(parts) for parts in zip(*outs))

    def _value(self, obs: Obs) -> torch.Tensor:
        n = next(iter(obs.values())).shape[0]
        parts = [self.policy.value({k: v[i : i + self.EVAL_ROWS] for k, v in obs.items()})
                 for i in range(0, n, self.EVAL_ROWS)]
        return torch.cat(parts) if parts else torch.zeros(0, device=self.device)

    @torch.no_grad()
    def _prepare_segment(self, seg: Segment, version: int) -> Batch:
        T, B = seg.num_steps, seg.num_envs
        obs = self._obs(seg.obs)
        actions = _flat(self._t(seg.actions))
        extras = self._obs(seg.extras)
        behaviour_logp = _flat(self._t(seg.logprobs))

        logp_old, _, values = self._evaluate(obs, actions, extras)
        values = values.reshape(T, B)
        last_value = self._value(self._obs(seg.next_obs, flat=False))
        terminated, truncated = self._t(seg.terminated), self._t(seg.truncated)
        # The value of an episode's last observation only matters where it was truncated.
        final_values = torch.zeros(T * B, device=self.device)
        ended = truncated.reshape(-1).nonzero().squeeze(-1)
        if len(ended):
            final_values[ended] = self._value({k: _flat(self._t(v))[ended] for k, v in seg.final_obs.items()})
        final_values = final_values.reshape(T, B)

        # Off-policy correction: lag-0 samples use the behaviour log-prob itself, so their
        # importance weight is exactly 1; lagged ones get min(pi_old / mu, rho_bar).
        lags = policy_lag(version, self._t(seg.versions)).repeat_interleave(B)
        lag0 = _broadcast(lags == 0, logp_old)
        logp_old = torch.where(lag0, behaviour_logp, logp_old)
        is_weights = truncated_importance_weights(logp_old, behaviour_logp, self.cfg.rho_bar)

        next_values = bootstrap_next_values(values, last_value, terminated, truncated, final_values)
        rewards = self._t(seg.rewards) * self.reward_scale
        advantages, returns = compute_gae(
            rewards, values, next_values, terminated | truncated, self.cfg.gamma, self.cfg.gae_lambda
        )
        return Batch(obs, actions, extras, logp_old, is_weights, values.reshape(-1),
                     advantages.reshape(-1), returns.reshape(-1), lags)

    def prepare(self, segments: list[Segment], version: int) -> Batch:
        batch = Batch.cat([self._prepare_segment(s, version) for s in segments])
        keep = lag_mask(batch.lags, self.cfg.max_policy_lag)
        return batch.select(keep.nonzero().squeeze(-1))

    def update(self, segments: list[Segment], version: int) -> dict[str, float]:
        """One PPO update (epochs x minibatches) on the given segments; returns metrics."""
        total = sum(s.num_steps * s.num_envs for s in segments)
        lags = torch.cat([policy_lag(version, self._t(s.versions)).repeat_interleave(s.num_envs) for s in segments]).float()
        lag_stats = {"throughput/policy_lag": lags.mean().item(), "throughput/policy_lag_max": lags.max().item()}
        batch = self.prepare(segments, version)
        stats: dict[str, list[float]] = {}
        if len(batch) == 0:
            return {"train/dropped_samples": float(total), **lag_stats}
        mb_size = max(1, len(batch) // self.cfg.num_minibatches)
        warmup = self.updates < self.cfg.critic_warmup_updates
        self.updates += 1
        for _ in range(self.cfg.update_epochs):
            perm = torch.randperm(len(batch), device=self.device)
            for start in range(0, len(batch) - mb_size + 1, mb_size):
                mb = batch.select(perm[start : start + mb_size])
                adv = normalize_advantages(mb.advantages) if self.cfg.norm_adv else mb.advantages
                logp, entropy, values = self.policy.evaluate(mb.obs, mb.actions, mb.extras)
                pg_loss, pg_stats = policy_loss(
                    logp, mb.logp_old, _broadcast(adv, logp), self.cfg.clip_ratio_low, self.cfg.clip_ratio_high,
                    self.cfg.dual_clip, weights=mb.is_weights,
                )
                v_loss, v_stats = value_loss(values, mb.values_old, mb.returns, self.cfg.value_clip)
                if warmup:  # the policy keeps its (SFT) weights until the critic has caught up
                    loss = self.cfg.vf_coef * v_loss
                else:
                    loss = ppo_total_loss(pg_loss, v_loss, entropy, self.cfg)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], self.cfg.max_grad_norm)
                for key, val in {
                    "train/actor/policy_loss": pg_loss.item(),
                    "train/actor/approx_kl": pg_stats["approx_kl"],
                    "train/actor/clip_fraction": pg_stats["clip_fraction"],
                    "train/actor/dual_clip_fraction": pg_stats.get("dual_clip_fraction", 0.0),
                    "train/actor/grad_norm": float(grad_norm),
                    "train/actor/entropy": entropy.mean().item(),
                    "train/critic/value_loss": v_loss.item(),
                    "train/critic/value_clip_ratio": v_stats["value_clip_ratio"],
                }.items():
                    stats.setdefault(key, []).append(val)
                self.optimizer.step()
        # Whitening stats move after the update, so the log-probs above were computed with the
        # same normalisation the behaviour policy used (lag-0 ratios start at exactly 1).
        self.policy.update_normalization(batch.obs)
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out["train/critic/explained_variance"] = explained_variance(batch.values_old, batch.returns)
        out["rollout/returns_mean"] = batch.returns.mean().item()
        out["rollout/advantages_mean"] = batch.advantages.mean().item()
        out["rollout/is_weight_mean"] = batch.is_weights.mean().item()
        out.update(lag_stats)  # over every received sample, the dropped ones included
        out["train/dropped_samples"] = float(total - len(batch))
        out["train/critic_warmup"] = float(warmup)
        out["train/samples"] = float(len(batch))
        return out
