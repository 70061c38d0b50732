"""PPO losses (Schulman et al. 2017, "Proximal Policy Optimization
Algorithms") with the common implementation details (asymmetric clip range,
dual clip, value clipping, entropy bonus), in the decoupled form for a stale
asynchronous fleet (Hilton et al. 2021, "Batch size-invariance for policy
optimization"):

    ratio_t = pi_theta(a_t|s_t) / pi_old(a_t|s_t)      pi_old = learner's pre-update policy
    w_t     = min(pi_old(a_t|s_t) / mu(a_t|s_t), rho_bar)   mu = actor's behaviour policy

``w_t`` comes from :func:`rlfleet.algorithms.off_policy.truncated_importance_weights`
and is passed to :func:`policy_loss` as ``weights``.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def _per_element(x: Tensor, logp: Tensor, name: str) -> Tensor:
    """A per-sample [N] tensor as [N, 1, ...], so it broadcasts over a log-prob [N, *P].

    Why: per-action [N, K] and per-token [N, K*D] log-probs share their chunk's advantage (and
    every clip, the dual clip included, applies per element). Without the reshape an [N]
    advantage would broadcast against the *last* dim, silently wrong whenever N == P.
    """
    if x.dim() >= logp.dim():
        return x
    if x.shape != logp.shape[: x.dim()]:
        raise ValueError(f"{name} {tuple(x.shape)} does not lead the log-prob shape {tuple(logp.shape)}")
    return x.reshape(*x.shape, *([1] * (logp.dim() - x.dim())))


def _fraction(mask: Tensor) -> float:
    """Exact fraction of True entries (count / total, no float32 rounding)."""
    return int(mask.sum().item()) / mask.numel() if mask.numel() > 0 else 0.0


@dataclass
class PPOConfig:
    """PPO hyper-parameters (plain types: usable as an OmegaConf structured config)."""

    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_ratio_low: float = 0.2  # ratio lower bound is 1 - clip_ratio_low
    clip_ratio_high: float = 0.2  # ratio upper bound is 1 + clip_ratio_high
    dual_clip: float | None = None  # c > 1 (Ye et al. 2020); None disables
    value_clip: float | None = 0.2  # None disables value clipping
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 1.0
    norm_adv: bool = True
    # Whiten advantages per task over the whole update (all ranks) instead of per minibatch: in a
    # multitask batch the task whose returns vary most otherwise sets the scale, and a task with rare
    # successes gets advantages near zero (docs/algorithms.md, "Per-task advantage normalisation").
    norm_adv_per_task: bool = False
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 3e-4
    # The value head's own learning rate (None: `lr`). A fresh head on an SFT policy's frozen
    # features learns slowly at the actor's small fine-tuning lr, and its errors are the advantages.
    critic_lr: float | None = None
    max_policy_lag: int = 4  # samples older than this many learner updates are masked out
    rho_bar: float = 1.0  # truncated importance-weight cap
    critic_warmup_updates: int = 0  # first updates train only the critic (a fresh value head on an SFT policy)
    # The learning rate ramps linearly from lr/N to lr over the first N policy updates (after the
    # critic warm-up): Adam's first steps move every parameter by ~lr whatever its gradient, which
    # on tiny_oft from SFT gave approx_kl 0.25 and clip fraction 0.48 on the first update (0.01-0.02 later).
    lr_warmup_updates: int = 0
    # Advantages: "gae" (critic, GAE or V-trace) or "grpo" (critic-free, group-relative; whole-episode
    # segments of groups of `group_size` envs reset alike, see rlfleet.algorithms.grpo).
    adv_type: str = "gae"
    group_size: int = 8  # G, GRPO only
    group_filter: list[float] | None = None  # GRPO: [lo, hi] keeps groups with lo <= mean return <= hi
    # Off-policy correction of stale samples (GAE mode): "truncated_is" (decoupled PPO weights
    # min(pi_old/mu, rho_bar)) or "vtrace" (IMPALA targets and advantages, rlfleet.algorithms.vtrace).
    off_policy: str = "truncated_is"
    vtrace_c_bar: float = 1.0  # V-trace trace cutting c_bar (rho_bar is `rho_bar`)
    # KL(pi || pi_ref) penalty to the starting (SFT) policy, as RLinf's kl_beta and GRPO's beta:
    # keeps RL fine-tuning from pulling a shared backbone away from tasks it already solves.
    kl_beta: float = 0.0
    # What an episode cut by the time limit is worth after its last step. True: V(final obs), the
    # right target when the limit is only a cap on an endless task (Pardo et al. 2018). False: 0, the
    # right target when success must happen within the limit, as in the VLA recipes: a critic that
    # does not see the clock bootstraps a failed episode's end with the average value, so failing
    # costs almost nothing (docs/algorithms.md, "Time limits").
    bootstrap_truncated: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ValueError(f"clip_ratio_low must be in [0, 1), got {self.clip_ratio_low}")
        if self.clip_ratio_high < 0.0:
            raise ValueError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.value_clip is not None and self.value_clip <= 0.0:
            raise ValueError(f"value_clip must be > 0 (or None), got {self.value_clip}")
        if self.critic_lr is not None and self.critic_lr <= 0.0:
            raise ValueError(f"critic_lr must be > 0 (or None), got {self.critic_lr}")
        if self.rho_bar <= 0.0:
            raise ValueError(f"rho_bar must be > 0, got {self.rho_bar}")
        if self.max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {self.max_policy_lag}")
        if self.lr_warmup_updates < 0:
            raise ValueError(f"lr_warmup_updates must be >= 0, got {self.lr_warmup_updates}")
        if self.critic_warmup_updates < 0:
            raise ValueError(f"critic_warmup_updates must be >= 0, got {self.critic_warmup_updates}")
        if self.update_epochs < 1 or self.num_minibatches < 1:
            raise ValueError("update_epochs and num_minibatches must be >= 1")
        if self.kl_beta < 0.0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.vtrace_c_bar <= 0.0:
            raise ValueError(f"vtrace_c_bar must be > 0, got {self.vtrace_c_bar}")
        if self.group_filter is not None:
            lo_hi = list(self.group_filter)
            if len(lo_hi) != 2 or not lo_hi[0] <= lo_hi[1]:
                raise ValueError(f"group_filter must be [lo, hi] with lo <= hi, got {lo_hi}")
        from rlfleet.algorithms.estimators import check_estimator  # it imports this module

        check_estimator(self)


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss (Schulman et al. 2017, eq. 7), negated for descent.

        ratio  = exp(logp - logp_old)
        L_clip = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
        dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games
        with Deep RL"), only where A < 0:
            L = min(L_clip, -c * A)          (bounds the loss when ratio >> 1)
        loss   = mean(w * L)                  (w = truncated IS weights, Hilton et al. 2021)

    Asymmetric ``clip_low``/``clip_high`` as in DAPO's "clip-higher" (Yu et al.
    2025).  ``logp_old`` is the learner's pre-update log-prob (a constant).
    Per-action / per-token log-probs ``[N, *P]`` take a per-sample advantage
    ``[N]`` (or already broadcast ``[N, 1, ...]``); the ratio, both clips and
    the dual clip then act per element.

    Stats (python floats): ``approx_kl`` = mean((ratio - 1) - log ratio)
    (Schulman's k3 KL(old||new) estimator), ``clip_fraction`` = fraction with
    ratio outside [1 - clip_low, 1 + clip_high], ``ratio_mean``,
    ``dual_clip_fraction`` = fraction where the dual-clip bound is active,
    ``policy_loss``.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    log_ratio = logp - logp_old.detach()
    ratio = torch.exp(log_ratio)
    per_sample, dual_active = clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip, weights)
    loss = per_sample.mean()

    with torch.no_grad():
        clipped = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
        stats = {
            "approx_kl": ((ratio - 1.0) - log_ratio).mean().item(),
            "clip_fraction": _fraction(clipped),
            "ratio_mean": ratio.mean().item(),
            "dual_clip_fraction": _fraction(dual_active),
            "policy_loss": loss.item(),
        }
    return loss, stats


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The clipped surrogate per element, and where the dual clip is active (see :func:`policy_loss`):

        L = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
        L = min(L, -c * A) where A < 0                        (dual clip c)
        L = w * L                                             (truncated IS weights w, constants)

    A per-sample advantage or weight ``[N]`` applies to each element of a ``[N, *P]`` ratio.
    """
    advantages = _per_element(advantages.detach(), ratio, "advantages")
    pg_loss_unclipped = -advantages * ratio
    pg_loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_sample = torch.max(pg_loss_unclipped, pg_loss_clipped)

    def weighted(x: Tensor) -> Tensor:
        return x if weights is None else _per_element(weights, ratio, "weights").detach() * x

    if dual_clip is None:
        return weighted(per_sample), torch.zeros_like(ratio, dtype=torch.bool)
    dual_bound = -dual_clip * advantages  # > 0 where A < 0
    negative_adv = advantages < 0
    dual_active = negative_adv & (per_sample > dual_bound)
    per_sample = torch.where(negative_adv, torch.min(per_sample, dual_bound), per_sample)
    return weighted(per_sample), dual_active


def clipped_value_error(
    values: Tensor, values_old: Tensor, returns: Tensor, value_clip: float | None
) -> tuple[Tensor, Tensor]:
    """The squared value error per sample, clipped around the pre-update values (see
    :func:`value_loss`), and where the clipped term is the larger."""
    values_old = values_old.detach()
    returns = returns.detach()
    loss_unclipped = (values - returns) ** 2
    if value_clip is None:
        return loss_unclipped, torch.zeros_like(loss_unclipped, dtype=torch.bool)
    values_clipped = values_old + torch.clamp(values - values_old, -value_clip, value_clip)
    loss_clipped = (values_clipped - returns) ** 2
    return torch.max(loss_unclipped, loss_clipped), loss_clipped > loss_unclipped


def value_loss(
    values: Tensor, values_old: Tensor, returns: Tensor, value_clip: float | None
) -> tuple[Tensor, dict[str, float]]:
    """Value regression, optionally clipped around the pre-update values.

        unclipped: 0.5 * mean((v - R)^2)
        clipped:   v_clip = v_old + clamp(v - v_old, -c, c)
                   0.5 * mean(max((v - R)^2, (v_clip - R)^2))

    Value clipping is a PPO implementation detail from OpenAI baselines
    (see Engstrom et al. 2020, "Implementation Matters in Deep Policy
    Gradients"; Huang et al. 2022, "The 37 Implementation Details of PPO").

    Stats: ``value_clip_ratio`` = fraction where the clipped term is strictly
    larger (0.0 when not clipping), ``value_loss``.
    """
    error, clipped = clipped_value_error(values, values_old, returns, value_clip)
    loss = 0.5 * error.mean()
    clip_ratio = 0.0 if value_clip is None else _fraction(clipped)
    return loss, {"value_clip_ratio": clip_ratio, "value_loss": loss.item()}


def explained_variance(returns_var: float, residual_var: float) -> float:
    """EV = 1 - Var[R - V] / Var[R] from the two population variances (1: perfect critic, 0: as
    good as a constant, < 0: worse than a constant). Taking variances, not tensors, lets the
    learner pass moments reduced over all ranks.

    NaN when Var[R] == 0 (EV is undefined; the convention of CleanRL / Stable-Baselines3), so
    callers log it with a nan-aware aggregate.
    """
    if returns_var == 0.0 or math.isnan(returns_var):
        return float("nan")
    return 1.0 - residual_var / returns_var


KL_LOG_RATIO_CLAMP = 20.0
KL_CLAMP = 10.0


def kl_to_reference(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """Per-element estimate of KL(pi_theta || pi_ref) from actions sampled by (nearly) pi_theta.

        log r = log pi_ref(a|s) - log pi_theta(a|s)
        KL   ~= exp(log r) - log r - 1           (Schulman's k3: unbiased, always >= 0)

    As in GRPO (Shao et al. 2024, "DeepSeekMath", eq. 4), where it is added to the loss with
    weight beta. ``logp_ref`` is a constant (the frozen reference policy's log-prob). Bounded as
    verl's low_var_kl (log r to +-20, the estimate to <= 10): with continuous densities (a Flow-SDE
    step's narrow Gaussian) exp(log r) overflowed to 1e24 on tiny_pi0.
    """
    log_r = torch.clamp(logp_ref.detach() - logp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(log_r) - log_r - 1.0, max=KL_CLAMP)


def ppo_total_loss(pg_loss: Tensor, v_loss: Tensor, entropy: Tensor, cfg: PPOConfig) -> Tensor:
    """loss = L_pg + vf_coef * L_v - ent_coef * mean(H[pi])  (Schulman et al. 2017, eq. 9).

    The entropy term is a bonus (subtracted) that discourages premature
    collapse of exploration.
    """
    return pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy.mean()


def update_loss(
    pg_loss: Tensor,
    v_loss: Tensor,
    entropy: Tensor,
    kl_ref: Tensor | None,
    cfg: PPOConfig,
    train_actor: bool = True,
    train_critic: bool = True,
) -> Tensor:
    """The loss one minibatch step minimises:

        actor and critic (PPO)        L = L_pg + vf_coef * L_v - ent_coef * mean(H) [+ kl_beta * KL_ref]
        actor only (GRPO, no critic)  L = L_pg - ent_coef * mean(H)                 [+ kl_beta * KL_ref]
        critic only (warm-up)         L = vf_coef * L_v

    ``kl_ref``: the mean of :func:`kl_to_reference`, or None without a reference policy. During
    the critic warm-up the policy keeps its (SFT) weights, so neither its terms nor the KL count.
    """
    if not train_actor:
        return cfg.vf_coef * v_loss
    if train_critic:
        loss = ppo_total_loss(pg_loss, v_loss, entropy, cfg)
    else:  # critic-free: the value head gets no gradient
        loss = pg_loss - cfg.ent_coef * entropy.mean()
    if kl_ref is not None:
        loss = loss + cfg.kl_beta * kl_ref
    return loss
