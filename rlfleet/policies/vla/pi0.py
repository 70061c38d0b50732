"""pi0-style flow-matching policies (Black et al. 2024) and the pi0.5 variant.

An action expert predicts the velocity that carries noise to the normalised action chunk,
conditioned on the fused observation prefix. Convention: s = 0 noise, s = 1 data,

    x_s = (1 - s) x0 + s x1,    u = x1 - x0,    sft loss = || v(x_s, s | o) - u ||^2
    sampling: x0 ~ N(0, I), x_{i+1} = x_i + dt v(x_i, s_i | o), s_i = i dt, dt = 1 / N (`num_denoise_steps`).

A flow sample has no tractable log-prob, so PPO needs a stochastic policy built on the flow;
`VLAConfig.flow_rl` picks one (the math lives in `rlfleet/algorithms/flow.py`):

- `gaussian` (default): Gaussian with a learned state-independent std around the ODE output,
      mu = ode(x0 | o),  a = mu + sigma eps,  log pi(a | o, x0) = sum log N(a; mu, sigma);
  x0 returned as the extra `noise` so the learner recomputes the same mu. The sampled action is
  not clamped before its log-prob is taken; the env clips.
- `sde` (Flow-SDE, piRL): one denoise step k ~ U{0..N-1} per sample is a step of the SDE with
  the ODE's marginals, the others are Euler steps; the policy's "action" is x_{k+1}:
      log pi(x_{k+1} | o, x0, k) = sum log N(x_{k+1}; mu_k(x_k), std_k),
  with x_k recomputed from x0 by the deterministic chain (extras `flow_x0`, `flow_step`, `flow_xnext`).
- `noise` (Flow-Noise, ReinFlow): every step is Gaussian, x_{i+1} ~ N(x_i + dt v, sigma_i^2) with
  sigma_i from a learned bounded noise network; the log-prob is the joint one of the chain,
      log pi(x_1..x_N | o, x0) = sum_i sum log N(x_{i+1}; x_i + dt v(x_i, s_i), sigma_i),
  with the whole chain x_0..x_N as the extra `flow_chain`.

In `sde` and `noise` modes the env action is the chain's end, clamped to [-1, 1] (the range the
flow was trained on) before un-normalising; it plays no part in the log-prob. Deterministic
acting (evaluation) is the plain ODE from x0 = 0 in every mode, clamped.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributions import Beta

from rlfleet.algorithms.flow import (
    bounded_std,
    euler_step,
    flow_sde_step,
    gaussian_entropy,
    gaussian_log_prob,
)
from rlfleet.policies.vla.backbone import VLAConfig, VLAPolicyBase, mlp

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
MIN_LOG_STD, MAX_LOG_STD = -5.0, 1.0
_TIME_DIM = 32
_T_SCALE = 0.999  # pi0 samples t in [0, 0.999]: exactly t = 1 would make x_t the data itself
NOISE_NET_WIDTH = 64


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
            for _ in range(num_blocks)
        )
        self.out_norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, num_tokens)
        self.hidden_size = hidden  # what `hidden` returns per row: the critic's and noise net's input width
        nn.init.zeros_(self.out.weight)  # v = 0 at init: the untrained ODE leaves x0 unchanged
        nn.init.zeros_(self.out.bias)

    def hidden(self, x_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.inp(torch.cat([x_t, cond], -1)) + self.time(time_embedding(t))
        for block in self.blocks:
            h = h + block(h)
        return self.out_norm(h)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.out(self.hidden(x_t, t, cond))


class FlowNoiseNet(nn.Module):
    """Flow-Noise's exploration std (ReinFlow; RLinf's ExploreNoiseNet): a small MLP on the expert's
    hidden state and the time, (h_i [B, H], s_i [B]) -> sigma_i [B, K*D] in [min_std, max_std].

    The last layer starts at zero, so every step starts with sigma = (min_std + max_std) / 2
    whatever the state: the SFT policy's exploration is the same everywhere until RL shapes it.
    """

    def __init__(self, hidden: int, num_tokens: int, min_std: float, max_std: float, width: int = NOISE_NET_WIDTH):
        super().__init__()
        self.min_std, self.max_std = min_std, max_std
        self.net = mlp([hidden + _TIME_DIM, width, num_tokens])
        nn.init.zeros_(self.net[-1].weight)

    def forward(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return bounded_std(self.net(torch.cat([h, time_embedding(s)], -1)), self.min_std, self.max_std)


class FlowPolicyMixin:
    """The flow-matching policy contract on any prefix and action expert (the tiny family here, the
    transformers family in `rlfleet.policies.hf`).

    The class using it provides `cfg` (the flow settings of `VLAConfig`), `norm`, `num_tokens`,
    `chunk_size`, `action_dim`, `_reduce`, `prefix_feature(obs) -> cond`, `_prefix_summary(cond) ->
    [B, C]` and `expert` with `expert(x_t, t, cond) -> v`, `expert.hidden(x_t, t, cond) -> h [B, H]`,
    `expert.out(h) -> v` and `expert.hidden_size` (H). `cond` is whatever the expert reads (a tensor,
    or a key/value cache of the prefix); the flow code needs only its rows, dtype, device, `new_zeros`
    and `repeat_interleave(n, 0)`.
    """

    # Trained by RL only: an SFT checkpoint without them still starts a Flow-Noise / Gaussian run.
    exploration_parameters = ("noise_net.", "log_std")

    def _init_flow(self, critic_in: int, critic_width: int | None = None) -> None:
        """The critic (on the prefix feature [critic_in] or the expert's hidden state, one hidden
        layer of `critic_width`, default critic_in) and the parameters of `cfg.flow_rl`'s
        stochastic policy (after `expert`)."""
        cfg, n = self.cfg, self.num_tokens
        self.flow_rl = cfg.flow_rl
        self.value_after_vlm = cfg.value_after_vlm or self.discrete_proprio  # pi0.5 always
        hidden = self.expert.hidden_size
        self.critic = mlp([critic_in if self.value_after_vlm else hidden, critic_width or critic_in, 1])
        # Each mode holds only the parameters it trains (DDP and the optimiser see no dead weights).
        if self.flow_rl == "gaussian":
            self.extra_outputs = {"noise": ((n,), "float32")}
            self.log_std = nn.Parameter(torch.full((n,), float(cfg.init_log_std)))
        elif self.flow_rl == "sde":
            self.extra_outputs = {
                "flow_x0": ((n,), "float32"),
                "flow_step": ((1,), "float32"),
                "flow_xnext": ((n,), "float32"),
            }
        else:
            self.extra_outputs = {"flow_chain": ((cfg.num_denoise_steps + 1, n), "float32")}
            self.noise_net = FlowNoiseNet(hidden, n, cfg.noise_min_std, cfg.noise_max_std)

    def _prefix_summary(self, cond: torch.Tensor) -> torch.Tensor:
        """The observation feature [B, C] the pi0.5 critic reads (here `cond` itself)."""
        return cond

    # ---- the flow -------------------------------------------------------------------------

    @property
    def _dt(self) -> float:
        return 1.0 / self.cfg.num_denoise_steps

    def _time(self, i: int, like: torch.Tensor) -> torch.Tensor:
        """s_i = i dt for every row [B]."""
        return torch.full(like.shape[:1], i * self._dt, dtype=like.dtype, device=like.device)

    def ode(self, x0: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Euler integration from s = 0 (x0) to s = 1: the normalised chunk [B, K*D], unclamped."""
        x = x0
        for i in range(self.cfg.num_denoise_steps):
            x = euler_step(x, self.expert(x, self._time(i, x), cond), self._dt)
        return x

    def _value(self, cond: torch.Tensor) -> torch.Tensor:
        """pi0: critic on the expert's hidden state at (x_t = 0, t = 0), a function of o alone;
        pi0.5 (`value_after_vlm`): critic on the VLM prefix feature. `critic_detach` keeps the
        value loss out of the expert and backbone in every `flow_rl` mode."""
        if self.value_after_vlm:
            feature = self._prefix_summary(cond)
        else:
            zeros = cond.new_zeros(cond.shape[0], self.num_tokens)
            feature = self.expert.hidden(zeros, zeros[:, 0], cond)
        return self.critic(feature.detach() if self.cfg.critic_detach else feature).squeeze(-1)

    def _unflatten(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(-1, self.chunk_size, self.action_dim)

    def _to_env(self, x1: torch.Tensor) -> torch.Tensor:
        """Chain end -> env action: clamp to the normalised range the flow was trained on, un-normalise."""
        return self.norm.unnormalize_action(self._unflatten(x1.clamp(-1.0, 1.0)))

    def _extras(self, extras: dict[str, torch.Tensor] | None, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        missing = [k for k in self.extra_outputs if extras is None or k not in extras]
        if missing:
            raise ValueError(
                f"{type(self).__name__}.evaluate (flow_rl={self.flow_rl}) needs extras {missing} (what act returned)"
            )
        return {k: extras[k].to(dtype) for k in self.extra_outputs}

    # ---- gaussian: N(ode(x0), sigma) ------------------------------------------------------

    def _log_std(self) -> torch.Tensor:
        return self.log_std.clamp(MIN_LOG_STD, MAX_LOG_STD)

    def _gaussian_logp(self, a_norm: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """Per-token log N(a; mu, sigma) [B, K*D]."""
        return gaussian_log_prob(a_norm, mean, self._log_std().exp().expand_as(mean))

    def _act_gaussian(self, cond: torch.Tensor, x0: torch.Tensor, deterministic: bool) -> dict[str, torch.Tensor]:
        """Stochastic: a = ode(x0) + sigma * eps, x0 ~ N(0, I). Deterministic: clamp(ode(0), -1, 1)."""
        mean = self.ode(x0, cond)
        if deterministic:
            a_norm = mean.clamp(-1.0, 1.0)
        else:
            a_norm = mean + self._log_std().exp() * torch.randn_like(mean)
        return {
            "actions": self.norm.unnormalize_action(self._unflatten(a_norm)),
            "logprobs": self._reduce(self._gaussian_logp(a_norm, mean)),
            "noise": x0,
        }

    def _evaluate_gaussian(
        self, cond: torch.Tensor, actions: torch.Tensor, extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gaussian log-prob around ode(x0) with the x0 the actor used; entropy."""
        mean = self.ode(extras["noise"].reshape(cond.shape[0], -1), cond)
        a_norm = self.norm.normalize_action(
            actions.reshape(actions.shape[0], -1, self.action_dim).to(cond.dtype), clamp=False
        ).reshape(cond.shape[0], -1)
        entropy = (0.5 + _HALF_LOG_2PI + self._log_std()).expand_as(mean)  # gaussian_entropy in log_std
        return self._gaussian_logp(a_norm, mean), entropy

    # ---- Flow-SDE: one stochastic step k of the marginal-preserving SDE -------------------

    def _act_sde(self, cond: torch.Tensor, x0: torch.Tensor, deterministic: bool) -> dict[str, torch.Tensor]:
        """x_{i+1} = x_i + dt v for i != k;  x_{k+1} = mu_k + std_k eps,  k ~ U{0..N-1} per sample.

        Deterministic: the plain ODE, reported as k = 0 with x_1 its Euler step (from x0 = 0 that
        is mu_0 itself, the score term -x0 / 1 being 0), so evaluate stays well defined on it.
        """
        steps, b = self.cfg.num_denoise_steps, x0.shape[0]
        k = (
            torch.zeros(b, dtype=torch.long, device=x0.device)
            if deterministic
            else torch.randint(steps, (b,), device=x0.device)
        )
        eps = torch.randn_like(x0)
        x, x_next, logp = x0, x0, torch.zeros_like(x0)
        for i in range(steps):
            s = self._time(i, x)
            u = self.expert(x, s, cond)
            step = euler_step(x, u, self._dt)
            at_k = (k == i).unsqueeze(-1)
            if at_k.any():
                mean, std = flow_sde_step(x, u, s.unsqueeze(-1), self._dt, self.cfg.sde_a)
                sampled = step if deterministic else mean + std * eps
                step = torch.where(at_k, sampled, step)
                logp = torch.where(at_k, gaussian_log_prob(step, mean, std), logp)
                x_next = torch.where(at_k, step, x_next)
            x = step
        return {
            "actions": self._to_env(x),
            "logprobs": self._reduce(logp),
            "flow_x0": x0,
            "flow_step": k.to(x0.dtype).unsqueeze(-1),
            "flow_xnext": x_next,
        }

    def _evaluate_sde(self, cond: torch.Tensor, extras: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Recompute x_k from x0 with the current weights (Euler steps 0..k-1), then
        log N(x_{k+1}; mu_k, std_k) per token; gradients reach the expert through mu_k and x_k."""
        b, steps = cond.shape[0], self.cfg.num_denoise_steps
        x = extras["flow_x0"].reshape(b, -1)
        x_next = extras["flow_xnext"].reshape(b, -1)
        k = extras["flow_step"].reshape(b).round().long()
        if (k < 0).any() or (k >= steps).any():
            raise ValueError(
                f"flow_step must be in [0, {steps - 1}] (num_denoise_steps={steps}), got "
                f"{k.min().item()}..{k.max().item()}"
            )
        logp, entropy = torch.zeros_like(x), torch.zeros_like(x)
        for i in range(int(k.max()) + 1):
            s = self._time(i, x)
            u = self.expert(x, s, cond)
            at_k = (k == i).unsqueeze(-1)
            mean, std = flow_sde_step(x, u, s.unsqueeze(-1), self._dt, self.cfg.sde_a)
            logp = torch.where(at_k, gaussian_log_prob(x_next, mean, std), logp)
            entropy = torch.where(at_k, gaussian_entropy(std), entropy)
            x = euler_step(x, u, self._dt)
        return logp, entropy

    # ---- Flow-Noise: a learned std on every step -----------------------------------------

    def _noise_step(self, x: torch.Tensor, s: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x_{i+1} ~ N(x_i + dt v(x_i, s_i), sigma_i^2), sigma_i = noise_net(h_i, s_i): (mean, std)."""
        h = self.expert.hidden(x, s, cond)
        return euler_step(x, self.expert.out(h), self._dt), self.noise_net(h, s)

    def _act_noise(self, cond: torch.Tensor, x0: torch.Tensor, deterministic: bool) -> dict[str, torch.Tensor]:
        """Sample the chain x_0..x_N; log-prob = sum over steps. Deterministic: the noise-free ODE
        (each x_{i+1} the mean), its log-prob the density at the means."""
        chain, logp, x = [x0], torch.zeros_like(x0), x0
        for i in range(self.cfg.num_denoise_steps):
            mean, std = self._noise_step(x, self._time(i, x), cond)
            x = mean if deterministic else mean + std * torch.randn_like(mean)
            logp = logp + gaussian_log_prob(x, mean, std)
            chain.append(x)
        return {"actions": self._to_env(x), "logprobs": self._reduce(logp), "flow_chain": torch.stack(chain, 1)}

    def _evaluate_noise(self, cond: torch.Tensor, extras: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint log-prob of the stored chain: all N transitions in one batched expert call [B*N]."""
        b, steps, n = cond.shape[0], self.cfg.num_denoise_steps, self.num_tokens
        chain = extras["flow_chain"].reshape(b, steps + 1, n)
        x, x_next = chain[:, :-1].reshape(b * steps, n), chain[:, 1:].reshape(b * steps, n)
        s = (torch.arange(steps, device=x.device, dtype=x.dtype) * self._dt).repeat(b)
        mean, std = self._noise_step(x, s, cond.repeat_interleave(steps, 0))
        logp = gaussian_log_prob(x_next, mean, std).reshape(b, steps, n).sum(1)
        entropy = gaussian_entropy(std).reshape(b, steps, n).sum(1)
        return logp, entropy

    # ---- the policy contract --------------------------------------------------------------

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        """Actions, behaviour log-prob, V(o) and what evaluate needs (see the module docstring)."""
        cond = self.prefix_feature(obs)
        shape = (cond.shape[0], self.num_tokens)
        x0 = cond.new_zeros(shape) if deterministic else torch.randn(shape, dtype=cond.dtype, device=cond.device)
        act_mode = {"gaussian": self._act_gaussian, "sde": self._act_sde, "noise": self._act_noise}[self.flow_rl]
        return {**act_mode(cond, x0, deterministic), "values": self._value(cond)}

    def evaluate(
        self, obs: dict[str, torch.Tensor], actions: torch.Tensor, extras: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log-prob and entropy [N, *logprob_shape] recomputed with the current weights; V(o) [N]."""
        cond = self.prefix_feature(obs)
        extras = self._extras(extras, cond.dtype)
        if self.flow_rl == "gaussian":
            logp, entropy = self._evaluate_gaussian(cond, actions, extras)
        elif self.flow_rl == "sde":
            logp, entropy = self._evaluate_sde(cond, extras)
        else:
            logp, entropy = self._evaluate_noise(cond, extras)
        return self._reduce(logp), self._reduce(entropy), self._value(cond)

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._value(self.prefix_feature(obs))

    @torch.no_grad()
    def sample(self, obs: dict[str, torch.Tensor], noise: torch.Tensor | None = None) -> torch.Tensor:
        """Plain flow sample (no exploration noise): clamp(ode(x0), -1, 1) in env units [B, K, D]."""
        cond = self.prefix_feature(obs)
        x0 = (
            noise
            if noise is not None
            else torch.randn(cond.shape[0], self.num_tokens, dtype=cond.dtype, device=cond.device)
        )
        return self._to_env(self.ode(x0, cond))

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


class TinyPi0Policy(FlowPolicyMixin, VLAPolicyBase):
    """Flow-matching action expert on the fused prefix; Gaussian, Flow-SDE or Flow-Noise RL (`flow_rl`)."""

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg: VLAConfig, image_size: int):
        super().__init__(state_dim, action_dim, chunk_size, cfg, image_size)
        self.expert = FlowActionExpert(self.num_tokens, cfg.dim, cfg.flow_hidden)
        self._init_flow(cfg.dim)


class TinyPi05Policy(TinyPi0Policy):
    """pi0.5 variant: proprio enters as discretised tokens, and the critic reads the VLM output."""

    discrete_proprio = True
