"""Corrections for an asynchronous fleet whose actors act with stale weights.

Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy
optimization"): the PPO ratio is taken against the learner's *pre-update*
("proximal") policy pi_old, and the gap between pi_old and the behaviour policy
mu that actually generated the sample is corrected by a truncated importance
weight min(pi_old/mu, rho_bar) (V-trace style truncation, Espeholt et al.
2018, "IMPALA").  Samples whose policy lag is too large are masked out of the update.
"""

from __future__ import annotations

import torch
from torch import Tensor


def truncated_importance_weights(learner_logp_old: Tensor, behaviour_logp: Tensor, rho_bar: float = 1.0) -> Tensor:
    """w = min(pi_old(a|s) / mu(a|s), rho_bar) = min(exp(logp_old - logp_mu), rho_bar).

    Hilton et al. 2021 (decoupled PPO); truncation as in IMPALA's rho-bar
    (Espeholt et al. 2018) bounds the variance.  Weights are constants in the
    loss (returned detached).  Where the two log-probs are exactly equal (an
    on-policy sample) the weight is exactly 1.0 when ``rho_bar >= 1``; this
    holds also for equal infinite log-probs (where the difference would be NaN).
    """
    if rho_bar <= 0:
        raise ValueError(f"rho_bar must be > 0, got {rho_bar}")
    if learner_logp_old.shape != behaviour_logp.shape:
        raise ValueError(f"shape mismatch: {tuple(learner_logp_old.shape)} vs {tuple(behaviour_logp.shape)}")
    a = learner_logp_old.detach()
    b = behaviour_logp.detach().to(a.dtype)
    log_ratio = torch.where(a == b, torch.zeros_like(a), a - b)
    return torch.exp(log_ratio).clamp(max=rho_bar)


def policy_lag(learner_version: int, sample_versions: Tensor) -> Tensor:
    """lag = learner_version - version of the weights that generated each sample.

    Returns a long tensor of non-negative ints.  A sample *newer* than the
    learner (negative lag) is a version-bookkeeping bug (e.g. stale samples
    surviving a rollback to an older checkpoint), so it raises ValueError
    rather than being silently treated as on-policy.
    """
    lags = int(learner_version) - sample_versions.long()
    if lags.numel() > 0 and bool((lags < 0).any()):
        raise ValueError(
            f"sample_versions newer than learner_version={learner_version}: "
            f"max sample version {int(sample_versions.max())}"
        )
    return lags


def lag_mask(lags: Tensor, max_policy_lag: int) -> Tensor:
    """Bool mask keeping samples with ``0 <= lag <= max_policy_lag``.

    Why: beyond a few updates the truncated IS weight no longer corrects the
    bias well enough, so very stale samples are discarded.
    """
    if max_policy_lag < 0:
        raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
    return (lags >= 0) & (lags <= max_policy_lag)
