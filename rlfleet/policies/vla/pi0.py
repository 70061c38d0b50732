"""pi0-style flow-matching policies (Black et al. 2024) and the pi0.5 variant.

An action expert predicts the velocity that carries noise to the normalised action chunk,
conditioned on the fused observation prefix. Convention: t = 0 noise, t = 1 data,

    x_t = (1 - t) x0 + t x1,    u = x1 - x0,    sft loss = || v(x_t, t | o) - u ||^2
    sampling: x0 ~ N(0, I), x_{t+dt} = x_t + dt v(x_t, t | o) for `num_denoise_steps` Euler steps.

A flow sample has no tractable log-prob, so for PPO the policy is Gaussian around the ODE
output (as RLinf's "flow-noise" exploration, simplified to a state-independent sigma):

    mu = ode(x0 | o),   a = mu + sigma * eps,   log pi(a | o, x0) = sum log N(a; mu, sigma)

with x0 returned as an extra so the learner recomputes the same mu. The sampled action is not
clamped before its log-prob is taken; the env clips.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributions import Beta

from rlfleet.policies.vla.backbone import VLAConfig, VLAPolicyBase, mlp

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
MIN_LOG_STD, MAX_LOG_STD = -5.0, 1.0
_TIME_DIM = 32
_T_SCALE = 0.999  # pi0 samples t in [0, 0.999]: exactly t = 1 would make x_t the data itself


def time_embedding(t: torch.Tensor, dim: int = _TIME_DIM) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1] [B] -> [B, dim], periods from 2 pi down to 2 pi / 1000."""
    freqs = torch.exp(torch.linspace(0.0, math.log(1000.0), dim // 2, device=t.device, dtype=t.dtype))
    angles = t.unsqueeze(-1) * freqs
    return torch.cat([angles.sin(), angles.cos()], -1)


class FlowActionExpert(nn.Module):
    """(x_t [B, K*D], t [B], obs feature [B, C]) -> velocity [B, K*D]; a residual MLP."""

    def __init__(self, num_tokens: int, cond_dim: int, hidden: int, num_blocks: int = 2):
        super().__init__()
        self.inp = nn.Linear(num_tokens + cond_dim, hidden)
        self.time = nn.Sequential(nn.Linear(_TIME_DIM, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, hidden))
            for _ in range(num_blocks))
        self.out_norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, num_tokens)
        nn.init.zeros_(self.out.weight)  # v = 0 at init: the untrained ODE leaves x0 unchanged
        nn.init.zeros_(self.out.bias)

    def hidden(self, x_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.inp(torch.cat([x_t, cond], -1)) + self.time(time_embedding(t))
        for block in self.blocks:
            h = h + block(h)
        return self.out_norm(h)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.out(self.hidden(x_t, t, cond))


class TinyPi0Policy(VLAPolicyBase):
    """Flow-matching action expert on the fused prefix; Gaussian exploration for PPO."""

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg: VLAConfig, image_size: int):
        super().__init__(state_dim, action_dim, chunk_size, cfg, image_size)
        n = self.num_tokens
        self.extra_outputs = {"noise": ((n,), "float32")}
        self.value_after_vlm = cfg.value_after_vlm or self.discrete_proprio  # pi0.5 always
        self.expert = FlowActionExpert(n, cfg.dim, cfg.flow_hidden)
        self.critic = mlp([cfg.dim if self.value_after_vlm else cfg.flow_hidden, cfg.dim, 1])
        self.log_std = nn.Parameter(torch.full((n,), float(cfg.init_log_std)))

    def _log_std(self) -> torch.Tensor:
        return self.log_std.clamp(MIN_LOG_STD, MAX_LOG_STD)

    def ode(self, x0: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Euler integration from t = 0 (x0) to t = 1: the normalised chunk [B, K*D], unclamped."""
        steps = self.cfg.num_denoise_steps
        dt, x = 1.0 / steps, x0
        for i in range(steps):
            t = torch.full(x.shape[:1], i * dt, dtype=x.dtype, device=x.device)
            x = x + dt * self.expert(x, t, cond)
        return x

    def _value(self, cond: torch.Tensor) -> torch.Tensor:
        """pi0: critic on the expert's hidden state at (x_t = 0, t = 0), a function of o alone;
        pi0.5 (`value_after_vlm`): critic on the VLM prefix feature."""
        if self.value_after_vlm:
            feature = cond
        else:
            zeros = cond.new_zeros(cond.shape[0], self.num_tokens)
            feature = self.expert.hidden(zeros, zeros[:, 0], cond)
        return self.critic(feature.detach() if self.cfg.critic_detach else feature).squeeze(-1)

    def _gaussian_logp(self, a_norm: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """Per-token log N(a; mu, sigma) [B, K*D]."""
        log_std = self._log_std()
        z = (a_norm - mean) / log_std.exp()
        return -0.5 * z.square() - log_std - _HALF_LOG_2PI

    def _unflatten(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(-1, self.chunk_size, self.action_dim)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        """Stochastic: a = ode(x0) + sigma * eps, x0 ~ N(0, I). Deterministic: clamp(ode(0), -1, 1)."""
        cond = self.prefix_feature(obs)
        shape = (cond.shape[0], self.num_tokens)
        x0 = cond.new_zeros(shape) if deterministic else torch.randn(shape, dtype=cond.dtype, device=cond.device)
        mean = self.ode(x0, cond)
        if deterministic:
            a_norm = mean.clamp(-1.0, 1.0)
        else:
            a_norm = mean + self._log_std().exp() * torch.randn_like(mean)
        return {"actions": self.norm.unnormalize_action(self._unflatten(a_norm)),
                "logprobs": self._reduce(self._gaussian_logp(a_norm, mean)),
                "values": self._value(cond), "noise": x0}

    def evaluate(self, obs: dict[str, torch.Tensor], actions: torch.Tensor,
                 extras: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gaussian log-prob around ode(x0) with the x0 the actor used; entropy; V(o)."""
        if extras is None or "noise" not in extras:
            raise ValueError(f"{type(self).__name__}.evaluate needs extras['noise'] (the x0 that act returned)")
        cond = self.prefix_feature(obs)
        mean = self.ode(extras["noise"].to(cond.dtype).reshape(cond.shape[0], -1), cond)
        a_norm = self.norm.normalize_action(actions.reshape(actions.shape[0], -1, self.action_dim).to(cond.dtype),
                                            clamp=False).reshape(cond.shape[0], -1)
        # H[N(mu, sigma)] = 1/2 + log(2 pi)/2 + log sigma per token
        entropy = (0.5 + _HALF_LOG_2PI + self._log_std()).expand_as(mean)
        return self._reduce(self._gaussian_logp(a_norm, mean)), self._reduce(entropy), self._value(cond)

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._value(self.prefix_feature(obs))

    @torch.no_grad()
    def sample(self, obs: dict[str, torch.Tensor], noise: torch.Tensor | None = None) -> torch.Tensor:
        """Plain flow sample (no exploration noise): clamp(ode(x0), -1, 1) in env units [B, K, D]."""
        cond = self.prefix_feature(obs)
        x0 = noise if noise is not None else torch.randn(cond.shape[0], self.num_tokens, dtype=cond.dtype,
                                                          device=cond.device)
        return self.norm.unnormalize_action(self._unflatten(self.ode(x0, cond).clamp(-1.0, 1.0)))

    def sft_loss(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        """Flow matching: MSE(v(x_t, t), x1 - x0), t = 0.999 (1 - b), b ~ Beta(1.5, 1) (pi0's
        schedule: more weight on the noisy end, where the velocity field is hardest)."""
        cond = self.prefix_feature(obs)
        x1 = self.norm.normalize_action(actions.reshape(actions.shape[0], -1, self.action_dim).to(cond.dtype))
        x1 = x1.reshape(cond.shape[0], -1)
        x0 = torch.randn_like(x1)
        b = Beta(torch.tensor(1.5, device=x1.device), torch.tensor(1.0, device=x1.device)).sample((x1.shape[0],))
        t = (_T_SCALE * (1.0 - b)).to(x1.dtype)
        x_t = (1.0 - t).unsqueeze(-1) * x0 + t.unsqueeze(-1) * x1
        return (self.expert(x_t, t, cond) - (x1 - x0)).square().mean()


class TinyPi05Policy(TinyPi0Policy):
    """pi0.5 variant: proprio enters as discretised tokens, and the critic reads the VLM output."""

    discrete_proprio = True
