"""Flow-matching policies as stochastic policies for PPO: the math of Flow-SDE and Flow-Noise.

A flow policy samples an action chunk by integrating a learned velocity field from noise to
data. The deterministic ODE has no tractable log-prob, so RL needs stochastic transitions whose
densities are Gaussian and cheap to evaluate. Two ways (both in RLinf, used by
`rlfleet.policies.vla.pi0.TinyPi0Policy` through `policy.flow_rl`):

- Flow-SDE (Chen et al. 2025, "piRL: Online RL Fine-tuning for Flow-based
  Vision-Language-Action Models"; the ODE-to-SDE conversion of Liu et al. 2025, "Flow-GRPO:
  Training Flow Matching Models via Online RL"): the ODE is turned into an SDE with the same
  marginals, and its Euler-Maruyama step is a Gaussian transition with a fixed noise schedule.
- Flow-Noise (Zhang et al. 2025, "ReinFlow: Fine-tuning Flow Matching Policy with Online
  Reinforcement Learning"): a learned network outputs the std of a Gaussian around each
  Euler step, bounded in [min_std, max_std].

Time convention (rlfleet's pi0, as the pi0 paper's tau): s in [0, 1], s = 0 noise, s = 1 data,

    x_s = (1 - s) eps + s x1,   u(x_s, s) = dx/ds ~ x1 - eps,   grid s_i = i dt, dt = 1 / N.

piRL, Flow-GRPO and openpi's code write the same path with t = 1 - s (t = 1 noise) and
v = dx/dt = -u; every formula below is theirs rewritten with t -> 1 - s, v -> -u.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _as_tensor(s: Tensor | float, like: Tensor) -> Tensor:
    return torch.as_tensor(s, dtype=like.dtype, device=like.device)


def euler_step(x: Tensor, u: Tensor, dt: float) -> Tensor:
    """The deterministic ODE step: x_{i+1} = x_i + dt u(x_i, s_i)."""
    return x + dt * u


def denoised_estimates(x: Tensor, u: Tensor, s: Tensor | float) -> tuple[Tensor, Tensor]:
    """What x_s says about the endpoints of its straight path, given the velocity u = x1 - eps:

    x1_hat  = x_s + (1 - s) u        (data estimate)
    eps_hat = x_s - s u              (noise estimate)
    """
    s = _as_tensor(s, x)
    return x + (1 - s) * u, x - s * u


def rectified_flow_score(x: Tensor, u: Tensor, s: Tensor | float) -> Tensor:
    """The score of the marginal p_s written from the velocity (s < 1):

        grad_x log p_s(x) = -E[eps | x_s = x] / (1 - s) = -(x - s u) / (1 - s)

    (x_s = (1 - s) eps + s x1 with eps ~ N(0, I), so by Tweedie grad log p_s = -E[eps | x_s] / (1 - s),
    and E[eps | x_s] = eps_hat of `denoised_estimates`; Flow-GRPO's score in t = 1 - s.)
    """
    s = _as_tensor(s, x)
    return -(x - s * u) / (1 - s)


def flow_sde_sigma(s: Tensor | float, a: float, dt: float) -> Tensor:
    """piRL's noise schedule sigma_t = a sqrt(t / (1 - t)) at noise level t = 1 - s:

        sigma(s) = a sqrt((1 - s) / s),   with s = 0 replaced by s_1 = dt in the denominator

    (at the first step, s = 0, sigma would be infinite; RLinf evaluates the denominator at the
    next grid point instead, giving sigma(0) = a sqrt(N)). `a` is `VLAConfig.sde_a`.
    """
    s = torch.as_tensor(s)
    return a * torch.sqrt((1 - s) / s.clamp_min(dt))


def flow_sde_step(x: Tensor, u: Tensor, s: Tensor | float, dt: float, a: float) -> tuple[Tensor, Tensor]:
    """One Euler-Maruyama step of the SDE with the ODE's marginals: x_{i+1} ~ N(mean, std^2 I).

        dx = [u + sigma^2 / 2 grad log p_s(x)] ds + sigma dW          (same marginals as dx = u ds)
        mean = x + dt [u - sigma^2 (x - s u) / (2 (1 - s))]
        std  = sigma(s) sqrt(dt)

    Written as piRL / RLinf's `flow_sde` do: mean = x1_hat s' + eps_hat (1 - s' - sigma^2 dt / (2 (1 - s))),
    s' = s + dt. The score term pulls x toward the data by exactly what the injected noise spreads.
    """
    sigma = flow_sde_sigma(_as_tensor(s, x), a, dt)
    mean = euler_step(x, u + 0.5 * sigma.square() * rectified_flow_score(x, u, s), dt)
    std = (sigma * math.sqrt(dt)).expand_as(mean)
    return mean, std


def bounded_std(raw: Tensor, min_std: float, max_std: float) -> Tensor:
    """Flow-Noise's learned std, kept in [min_std, max_std] (ReinFlow bounds it the same way):

    sigma = min_std + (max_std - min_std) sigmoid(raw)
    """
    return min_std + (max_std - min_std) * torch.sigmoid(raw)


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Per-element log N(x; mean, std^2) = -(x - mean)^2 / (2 std^2) - log std - log(2 pi) / 2."""
    return -0.5 * ((x - mean) / std).square() - std.log() - _HALF_LOG_2PI


def gaussian_entropy(std: Tensor) -> Tensor:
    """Per-element H[N(mean, std^2)] = 1/2 + log(2 pi) / 2 + log std."""
    return 0.5 + _HALF_LOG_2PI + std.log()
