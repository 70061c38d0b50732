"""V-trace off-policy targets (Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with
Importance Weighted Actor-Learner Architectures", sec. 4.1, eq. 1 and the policy-gradient
advantage of sec. 4.2), selected with ``algorithm.off_policy: vtrace``.

In the fleet, pi is the learner's pre-update policy pi_old and mu the behaviour policy that
generated the sample (an actor's possibly stale weights). Layout is time-major ``[T, B]`` and
episode boundaries follow :func:`rlfleet.algorithms.gae.bootstrap_next_values`: the caller
passes ``next_values`` (0 after a termination, V(final obs) after a truncation, the bootstrap
value after the last step) and ``dones`` cuts the trace.
"""

from __future__ import annotations

import torch
from torch import Tensor


def chunk_log_ratio(logp_pi: Tensor, logp_mu: Tensor) -> Tensor:
    """log(pi/mu) of one sample: the sum over the policy's log-prob dims P of the log-ratios.

        log rho_n = sum_j (log pi_{n,j} - log mu_{n,j})        logp shapes [N, *P] -> [N]

    Why: a sample is a whole action chunk; per-action or per-token log-probs [N, K] / [N, K*D]
    factorise its probability, so the chunk's ratio is the product of the per-element ratios.
    Where the two log-probs are exactly equal (a lag-0 sample) the element's log-ratio is
    exactly 0, also for equal infinite log-probs, so the ratio is exactly 1.
    """
    if logp_pi.shape != logp_mu.shape:
        raise ValueError(f"shape mismatch: {tuple(logp_pi.shape)} vs {tuple(logp_mu.shape)}")
    a, b = logp_pi.detach(), logp_mu.detach().to(logp_pi.dtype)
    diff = torch.where(a == b, torch.zeros_like(a), a - b)
    return diff.reshape(diff.shape[0], -1).sum(dim=1)


def vtrace(
    log_rhos: Tensor,
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    dones: Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace value targets v_s and policy-gradient advantages (IMPALA eq. 1, sec. 4.2).

        rho_t   = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))
        c_i     = lam * min(c_bar, pi(a_i|x_i) / mu(a_i|x_i))
        delta_t = rho_t * (r_t + gamma * V(x_{t+1}) - V(x_t))
        v_s     = V(x_s) + sum_{t >= s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t
                computed backwards:  v_s - V(x_s) = delta_s + gamma * c_s * (1 - done_s) * (v_{s+1} - V(x_{s+1}))
        A_s     = rho_s * (r_s + gamma * v_{s+1} - V(x_s))       (policy-gradient advantage)

    ``lam`` is IMPALA's remark in sec. 4.1 (c_i scaled by lambda); lam = 1 is eq. 1 as printed.
    With all ratios 1 (on-policy) v_s is the TD(lambda) return, i.e. GAE(gamma, lambda)'s
    ``returns``. ``V(x_{t+1})`` is ``next_values[t]``; ``v_{s+1}`` is the next step's target
    inside an episode and ``next_values[s]`` where the episode ended after s or the rollout does.

    Args:
        log_rhos: ``[T, B]`` log(pi/mu) per step (:func:`chunk_log_ratio`).
        rewards, values, next_values: ``[T, B]``.  dones: ``[T, B]`` episode ended after step t.

    Returns:
        ``(vs, pg_advantages)``, both ``[T, B]``, no gradient.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [T, B], got shape {tuple(rewards.shape)}")
    for name, x in (("log_rhos", log_rhos), ("values", values), ("next_values", next_values), ("dones", dones)):
        if x.shape != rewards.shape:
            raise ValueError(f"{name} must have shape {tuple(rewards.shape)}, got {tuple(x.shape)}")
    if rho_bar <= 0 or c_bar <= 0:
        raise ValueError(f"rho_bar and c_bar must be > 0, got {rho_bar}, {c_bar}")
    with torch.no_grad():
        r = rewards if rewards.is_floating_point() else rewards.float()
        values, next_values = values.to(r.dtype), next_values.to(r.dtype)
        ratios = torch.exp(log_rhos.to(r.dtype))
        rhos = ratios.clamp(max=rho_bar)
        cs = lam * ratios.clamp(max=c_bar)
        not_done = 1.0 - dones.to(r.dtype)

        deltas = rhos * (r + gamma * next_values - values)
        vs_minus_v = torch.zeros_like(r)
        acc = torch.zeros_like(r[0])
        for t in reversed(range(r.shape[0])):
            acc = deltas[t] + gamma * cs[t] * not_done[t] * acc
            vs_minus_v[t] = acc
        vs = values + vs_minus_v

        # v_{s+1}: the next target inside an episode, the bootstrap value where it (or the rollout) ended
        next_vs = next_values.clone()
        inside = not_done[:-1].bool()
        next_vs[:-1] = torch.where(inside, vs[1:], next_values[:-1])
        pg_advantages = rhos * (r + gamma * next_vs - values)
    return vs, pg_advantages
