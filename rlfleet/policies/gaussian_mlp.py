"""The simplest policy: a Gaussian MLP actor and an MLP critic on state observations.

Observation normalisation lives inside the module as buffers, so it travels with the weights
to the inference servers and into checkpoints (one source of truth for both sides).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal

from rlfleet.policies.vla.tokenizer import WordTokenizer


@dataclass
class PolicyConfig:
    name: str = "gaussian_mlp"
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "tanh"
    init_log_std: float = -0.5
    min_log_std: float = -5.0
    max_log_std: float = 1.0
    obs_norm: bool = True
    obs_clip: float = 10.0
    # > 0: also read the `instructions` observation, as the mean of hashed-word embeddings of this
    # width beside the states (actor and critic). Envs whose state does not say what is asked need
    # it: a CALVIN chain's subtask, a multitask batch whose tasks share a state layout.
    instruction_dim: int = 0
    instruction_vocab: int = 1024  # hashed word ids (rlfleet.policies.vla.tokenizer), 0 = padding
    instruction_max_words: int = 16  # words read per instruction, the rest cut off


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))  # torch's Normal.log_prob constant (differs in the last bit)
_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
_ACTIVATION_FNS = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu, nn.ELU: F.elu, nn.SiLU: F.silu}


def _mlp(sizes: list[int], activation: str, out_gain: float) -> nn.Sequential:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r} (choose from {sorted(_ACTIVATIONS)})")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = nn.Linear(a, b)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else 2**0.5)
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(_ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


def _run_mlp(mlp: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """`mlp(x)` with the same ops (bit-identical) but without nn.Module's call dispatch, which
    costs more than a small layer's matmul at inference batch sizes (no hooks run)."""
    for layer in mlp:
        x = F.linear(x, layer.weight, layer.bias) if type(layer) is nn.Linear else _ACTIVATION_FNS[type(layer)](x)
    return x


class RunningNorm(nn.Module):
    """Running mean/variance (Chan et al. parallel update) used to whiten observations.

    Robust to a bad segment, since one outlier would otherwise whiten every later state to the
    same clipped features: rows with a non-finite value or one beyond MAX_ABS are left out, and
    once WARMUP samples are in, each value is clipped to mean +- OUTLIER_STD std before it
    counts, which bounds how far one update can move the statistics. Both are counted
    (`rejected_rows`, `clipped_values`) and reported by the trainer.
    """

    MAX_ABS = 1e6
    WARMUP = 1000
    OUTLIER_STD = 50.0

    def __init__(self, dim: int, clip: float):
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(1e-4))
        self.rejected_rows = 0
        self.clipped_values = 0

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()
        ok = x.abs().amax(1) <= self.MAX_ABS  # NaN propagates through amax and fails <=, as inf does
        self.rejected_rows += int((~ok).sum())
        x = x[ok]
        n = x.shape[0]
        if n == 0:
            return
        if float(self.count) >= self.WARMUP:
            mean, std = self.mean.double(), torch.sqrt(self.var.double() + 1e-8)
            lo, hi = mean - self.OUTLIER_STD * std, mean + self.OUTLIER_STD * std
            self.clipped_values += int(((x < lo) | (x > hi)).sum())
            x = torch.maximum(torch.minimum(x, hi), lo)
        b_mean, b_var = x.mean(0), x.var(0, unbiased=False)
        total = self.count.double() + n
        delta = b_mean - self.mean.double()
        new_mean = self.mean.double() + delta * n / total
        m2 = self.var.double() * self.count.double() + b_var * n + delta**2 * self.count.double() * n / total
        self.mean.copy_(new_mean.float())
        self.var.copy_((m2 / total).float())
        self.count.copy_(total.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)


class GaussianMLPPolicy(nn.Module):
    """pi(a_chunk | s, l) = N(mu(s, l), diag(sigma)); the chunk's log-prob sums over its K*D dims.

    Implements `rlfleet.policies.base.Policy` on `states`, and on `instructions` (l) as well with
    `instruction_dim` > 0.
    """

    obs_keys = ("states",)
    logprob_shape: tuple[int, ...] = ()
    extra_outputs: dict = {}

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg: PolicyConfig, image_size: int = 0):
        super().__init__()
        self.state_dim, self.action_dim, self.chunk_size = state_dim, action_dim, chunk_size
        self.cfg = cfg
        hidden = list(cfg.hidden_sizes)
        out = action_dim * chunk_size
        self.obs_norm = RunningNorm(state_dim, cfg.obs_clip) if cfg.obs_norm else None
        if cfg.instruction_dim < 0 or cfg.instruction_vocab < 2 or cfg.instruction_max_words < 1:
            raise ValueError(
                f"instruction_dim must be >= 0, instruction_vocab >= 2 and instruction_max_words >= 1, got "
                f"{cfg.instruction_dim}, {cfg.instruction_vocab}, {cfg.instruction_max_words}"
            )
        self.word_embed: nn.EmbeddingBag | None = None
        if cfg.instruction_dim:
            self.obs_keys = ("states", "instructions")
            self.tokenizer = WordTokenizer(cfg.instruction_vocab, cfg.instruction_max_words)
            # mode "mean" leaves padding_idx out of the mean: the embedding of the words alone. Actor
            # and critic share it, so the value loss trains it too (critic warm-up included).
            self.word_embed = nn.EmbeddingBag(cfg.instruction_vocab, cfg.instruction_dim, mode="mean", padding_idx=0)
        width = state_dim + cfg.instruction_dim
        self.actor = _mlp([width, *hidden, out], cfg.activation, out_gain=0.01)
        self.critic = _mlp([width, *hidden, 1], cfg.activation, out_gain=1.0)
        self.log_std = nn.Parameter(torch.full((out,), float(cfg.init_log_std)))

    def _features(self, states: torch.Tensor, instructions: torch.Tensor | None = None) -> torch.Tensor:
        x = self.obs_norm(states) if self.obs_norm is not None else states
        if self.word_embed is None:
            return x
        if instructions is None:
            raise ValueError("this gaussian_mlp reads instructions (instruction_dim > 0): pass obs['instructions']")
        return torch.cat([x, self.word_embed(self.tokenizer(instructions, x.device))], dim=-1)

    def _obs_features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._features(obs["states"], obs.get("instructions"))

    def _log_std(self) -> torch.Tensor:
        return self.log_std.clamp(self.cfg.min_log_std, self.cfg.max_log_std)

    def _normal(self, x: torch.Tensor) -> Normal:
        mu = self.actor(x)
        return Normal(mu, self._log_std().exp().expand_as(mu), validate_args=False)

    def distribution(self, states: torch.Tensor, instructions: torch.Tensor | None = None) -> Normal:
        return self._normal(self._features(states, instructions))

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.critic(self._obs_features(obs)).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        """Actions [B,K,D] (unclipped samples: the env clips), chunk log-prob [B], value [B].

        Written out instead of going through torch.distributions: this is the inference hot
        path, and at small batches the distribution objects cost more than the MLP.
        log N(a; mu, sigma) = -eps^2/2 - log sigma - log(2 pi)/2 with a = mu + sigma * eps.
        """
        x = self._obs_features(obs)
        mu, log_std = _run_mlp(self.actor, x), self._log_std()
        eps = torch.zeros_like(mu) if deterministic else torch.randn_like(mu)
        flat = mu + log_std.exp() * eps
        logp = (-0.5 * eps.square() - log_std - _HALF_LOG_2PI).sum(-1)
        return {
            "actions": flat.reshape(-1, self.chunk_size, self.action_dim),
            "logprobs": logp,
            "values": _run_mlp(self.critic, x).squeeze(-1),
        }

    def evaluate(
        self, obs: dict[str, torch.Tensor], actions: torch.Tensor, extras: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(a|s) [N], entropy [N] and V(s) [N] for the PPO update."""
        x = self._obs_features(obs)  # one feature pass for the policy and the value
        mu = self.actor(x)
        scale = self._log_std().exp().expand_as(mu)
        flat = actions.reshape(actions.shape[0], -1)
        # torch.distributions.Normal(mu, scale)'s log_prob and entropy, op for op on the same
        # tensors (the same values and gradients, bit for bit), without building the distribution
        # object, whose argument checks and broadcasting cost more than these few ops
        logp = -((flat - mu) ** 2) / (2 * scale**2) - scale.log() - _LOG_SQRT_2PI
        entropy = 0.5 + _HALF_LOG_2PI + torch.log(scale)
        return logp.sum(-1), entropy.sum(-1), self.critic(x).squeeze(-1)

    def sft_loss(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        """Behaviour cloning by maximum likelihood: mean -log pi(a_demo | s) per action dim."""
        dist = self.distribution(obs["states"], obs.get("instructions"))
        return -dist.log_prob(actions.reshape(actions.shape[0], -1)).mean()

    def update_normalization(self, obs: dict[str, torch.Tensor]) -> None:
        if self.obs_norm is not None:
            self.obs_norm.update(obs["states"])
