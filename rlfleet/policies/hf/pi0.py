"""pi0 and pi0.5 on a transformers VLM: a Gemma-shaped action expert attending to the prefix's
key/value cache (Black et al. 2024; the layout of openpi's PyTorch port and LeRobot's `pi0`).

The expert has one decoder layer per prefix layer, with the prefix's head count, key/value heads
and head size, so at layer i its queries attend to [the prefix's cached keys/values of layer i,
its own]. Its tokens are [state (pi0 only), K noisy actions fused with the flow time]; the state
token sees the prefix and itself, the action tokens see the prefix, the state and each other.
Positions continue after the prefix's valid tokens. The prefix runs once per act (`prefix_cache`);
every denoise step runs the expert alone.

Time convention: openpi integrates t from 1 (noise) to 0 with v = noise - action; the flow code
here (`FlowPolicyMixin`) integrates s = 1 - t from 0 to 1 with u = action - noise, so the expert
is fed t = 1 - s and its output negated: the same ODE step for step.

pi0.5 (`hf_pi05`): the state enters the prompt as discrete tokens ("State: 12 200 ...;"), the
suffix holds the actions alone and the critic reads the prefix. (openpi's pi0.5 also conditions
the expert's norms on the time, adaRMS; this port fuses the time into the action tokens as pi0.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from rlfleet.policies.hf.backbone import HFPolicyBase, HFPrefix, add_lora, merged_lora_state, rotate_half
from rlfleet.policies.hf.config import HFVLAConfig
from rlfleet.policies.vla.backbone import masked_mean
from rlfleet.policies.vla.pi0 import FlowPolicyMixin

MIN_PERIOD, MAX_PERIOD = 4e-3, 4.0  # pi0's time embedding periods


def pi0_time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """openpi's sine-cosine embedding of t [B] -> [B, dim]: periods from 4e-3 to 4 (geometric)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = MIN_PERIOD * (MAX_PERIOD / MIN_PERIOD) ** fraction
    angles = (2 * math.pi / period)[None, :] * t.to(torch.float64)[:, None]
    return torch.cat([angles.sin(), angles.cos()], 1).to(t.dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + w), computed in float32."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class ExpertAttention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(width, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, width, bias=False)

    def forward(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        prefix_k: torch.Tensor,
        prefix_v: torch.Tensor,
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        """h [B, S, W]; prefix_k/v [B, kv, P, hd]; allowed bool [B, 1, S, P + S]."""
        b, s, _ = h.shape
        q = self.q_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = torch.cat([prefix_k.to(k.dtype), k], 2)
        v = torch.cat([prefix_v.to(v.dtype), v], 2)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, 1)
            v = v.repeat_interleave(self.heads // self.kv_heads, 1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, -1))


class ExpertMLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class ExpertLayer(nn.Module):
    """A Gemma decoder layer whose attention also reads the prefix's cached keys/values."""

    def __init__(self, width: int, mlp: int, prefix: HFPrefix):
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(width, prefix.rms_eps)
        self.self_attn = ExpertAttention(width, prefix.num_heads, prefix.kv_heads, prefix.head_dim)
        self.post_attention_layernorm = GemmaRMSNorm(width, prefix.rms_eps)
        self.mlp = ExpertMLP(width, mlp)

    def forward(self, h, rope, prefix_k, prefix_v, allowed):  # type: ignore[no-untyped-def]
        h = h + self.self_attn(self.input_layernorm(h), rope, prefix_k, prefix_v, allowed)
        return h + self.mlp(self.post_attention_layernorm(h))


class ExpertStack(nn.Module):
    """`layers` and the final `norm`, named as a Gemma model's (the key map relies on it)."""

    def __init__(self, width: int, mlp: int, prefix: HFPrefix):
        super().__init__()
        self.layers = nn.ModuleList(ExpertLayer(width, mlp, prefix) for _ in range(prefix.num_layers))
        self.norm = GemmaRMSNorm(width, prefix.rms_eps)


@dataclass
class PrefixKV:
    """The flow head's condition: the prefix's per-layer keys/values, its valid mask, its pooled
    feature and the normalised state. Offers what the flow code needs of a tensor (rows, dtype,
    device, new_zeros, repeat_interleave); with `prefix_cache` off it holds the observation and
    recomputes the prefix on every use."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid: torch.Tensor  # [B, P]
    feature: torch.Tensor  # [B, C]
    state: torch.Tensor  # [B, max_state_dim] (zeros for pi0.5)
    recompute: object = None  # () -> PrefixKV, when the cache is off

    @property
    def shape(self) -> torch.Size:
        return self.feature.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.feature.dtype

    @property
    def device(self) -> torch.device:
        return self.feature.device

    def new_zeros(self, *shape: int | tuple[int, ...]) -> torch.Tensor:
        return self.feature.new_zeros(*shape)

    def repeat_interleave(self, n: int, dim: int = 0) -> PrefixKV:
        def rep(t: torch.Tensor) -> torch.Tensor:
            return t.repeat_interleave(n, dim)

        return PrefixKV(
            [rep(k) for k in self.keys],
            [rep(v) for v in self.values],
            rep(self.valid),
            rep(self.feature),
            rep(self.state),
        )

    def fresh(self) -> PrefixKV:
        return self.recompute() if callable(self.recompute) else self


class Pi0Expert(nn.Module):
    """(x_s [B, K*D], s [B], prefix) -> velocity [B, K*D] in this repo's convention (see module doc)."""

    def __init__(self, cfg: HFVLAConfig, prefix: HFPrefix, chunk_size: int, action_dim: int, state_token: bool):
        super().__init__()
        width = cfg.expert_width or prefix.width
        self.width, self.chunk_size, self.action_dim = width, chunk_size, action_dim
        self.max_action_dim = cfg.max_action_dim
        if action_dim > cfg.max_action_dim:
            raise ValueError(f"action_dim {action_dim} exceeds max_action_dim {cfg.max_action_dim}")
        self.model = ExpertStack(width, cfg.expert_mlp or 4 * width, prefix)
        self.state_proj = nn.Linear(cfg.max_state_dim, width) if state_token else None
        self.action_in_proj = nn.Linear(cfg.max_action_dim, width)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)
        self.action_out_proj = nn.Linear(width, cfg.max_action_dim)
        self._rotary = [prefix.lm.rotary_emb]  # the prefix model's RoPE (a list: not a submodule of ours)
        self.hidden_size = chunk_size * width  # what `hidden` returns per row
        self._autocast = prefix.autocast
        self._checkpointing = prefix.checkpointing

    def _rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, 1, S, head_dim] at `positions` [B, S], from the prefix model's own rotary
        embedding (its scaling rules included), so the expert's positions continue the prefix's."""
        cos, sin = self._rotary[0](like, positions)
        return cos[:, None], sin[:, None]

    def hidden(self, x_s: torch.Tensor, s: torch.Tensor, cond: PrefixKV) -> torch.Tensor:
        """The action tokens' last hidden states, flattened [B, K * width]."""
        cond = cond.fresh()
        b = x_s.shape[0]
        with self._autocast():
            actions = F.pad(
                x_s.reshape(b, self.chunk_size, self.action_dim), (0, self.max_action_dim - self.action_dim)
            )
            t = 1.0 - s  # openpi's time (see the module docstring)
            emb = self.action_in_proj(actions)
            time = pi0_time_embedding(t, self.width).to(emb.dtype)[:, None, :].expand_as(emb)
            tokens = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(torch.cat([emb, time], -1))))
            n_state = 0
            if self.state_proj is not None:
                tokens = torch.cat([self.state_proj(cond.state.to(tokens.dtype))[:, None], tokens], 1)
                n_state = 1
            n = tokens.shape[1]
            # state: prefix + itself; actions: prefix + state + all actions
            own = torch.ones(n, n, dtype=torch.bool, device=x_s.device)
            if n_state:
                own[0, 1:] = False
            allowed = torch.cat([cond.valid[:, None, :].expand(b, n, -1), own.expand(b, n, n)], 2)[:, None]
            positions = cond.valid.sum(1, keepdim=True) + torch.arange(n, device=x_s.device)[None]
            rope = self._rope(positions, tokens)
            h = tokens
            checkpoint = self._checkpointing()
            for layer, k, v in zip(self.model.layers, cond.keys, cond.values):
                if checkpoint:  # as the prefix's layers: recomputed in the backward pass
                    h = torch.utils.checkpoint.checkpoint(layer, h, rope, k, v, allowed, use_reentrant=False)
                else:
                    h = layer(h, rope, k, v, allowed)
            h = self.model.norm(h)[:, n_state:]
        return h.float().reshape(b, -1)

    def out(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden [B, K * width] -> velocity [B, K*D] (negated openpi velocity, padding dims dropped)."""
        b = h.shape[0]
        v = self.action_out_proj(h.reshape(b, self.chunk_size, self.width))[..., : self.action_dim]
        return -v.reshape(b, -1).float()

    def forward(self, x_s: torch.Tensor, s: torch.Tensor, cond: PrefixKV) -> torch.Tensor:
        return self.out(self.hidden(x_s, s, cond))


class HFPi0Policy(FlowPolicyMixin, HFPolicyBase):
    """pi0 on a transformers VLM; Gaussian, Flow-SDE or Flow-Noise RL (`flow_rl`)."""

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg: HFVLAConfig, image_size: int):
        super().__init__(state_dim, action_dim, chunk_size, cfg, image_size)
        if cfg.proprio_dims > cfg.max_state_dim:
            raise ValueError(f"proprio_dims {cfg.proprio_dims} exceeds max_state_dim {cfg.max_state_dim}")
        self.expert = Pi0Expert(cfg, self.prefix, chunk_size, action_dim, state_token=not self.discrete_proprio)
        self._init_flow(self.prefix.width, cfg.critic_width)
        if cfg.pi0_weights:
            from rlfleet.policies.checkpoint_io import resolve_model_path  # it imports the registry
            from rlfleet.policies.hf.keymap import load_pi0_weights

            load_pi0_weights(self, resolve_model_path(cfg.pi0_weights))
        if cfg.lora_expert:  # a pretrained expert: adapters on it too, its base frozen and never sent
            add_lora(self.expert.model, cfg)
            for name, p in self.expert.model.named_parameters():
                p.requires_grad_("lora_" in name)
        self.record_frozen_base()

    def export_merged(self, out: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """As the base class, and the expert's adapters folded into its layers too: the export holds
        the whole expert (it no longer comes from `pi0_weights`, which would overwrite the merge)."""
        settings, tensors = super().export_merged(out)
        if self.cfg.lora_expert:
            tensors = {k: v for k, v in tensors.items() if not k.startswith("expert.model.")}
            tensors.update({f"expert.model.{k}": v for k, v in merged_lora_state(self.expert.model).items()})
        return {**settings, "lora_expert": False}, tensors

    def base_modules(self) -> dict[str, nn.Module]:
        modules = super().base_modules()
        if self.cfg.lora_expert:
            modules["expert.model."] = self.expert.model
        return modules

    def _normalized_state(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.norm.normalize_state(obs["states"][:, : self.cfg.proprio_dims].to(self.norm.state_q01.dtype))

    def prompt_suffixes(self, obs: dict[str, torch.Tensor]) -> list[str] | None:
        """What follows each row's instruction in the prompt (pi0: nothing; its state is a token)."""
        return None

    def prefix_feature(self, obs: dict[str, torch.Tensor]) -> PrefixKV:
        """Run the prefix once: its keys/values for the expert, its pooled feature for the critic."""
        cond = PrefixKV(*_kv(self, obs))
        if not self.cfg.prefix_cache:
            cond.recompute = lambda: PrefixKV(*_kv(self, obs))
        return cond

    def _prefix_summary(self, cond: PrefixKV) -> torch.Tensor:  # type: ignore[override]
        return cond.feature


def _kv(policy: HFPi0Policy, obs: dict[str, torch.Tensor]) -> tuple:
    """One prefix pass: per-layer keys and values, valid mask, pooled feature, padded state (what
    `PrefixKV` holds; with `prefix_cache: false` every denoise step runs it again)."""
    out = policy.prefix(obs["main_images"], policy.texts(obs), suffixes=policy.prompt_suffixes(obs), want_cache=True)
    state = F.pad(policy._normalized_state(obs), (0, policy.cfg.max_state_dim - policy.cfg.proprio_dims))
    return out.keys, out.values, out.valid, masked_mean(out.hidden, out.valid), state


class HFPi05Policy(HFPi0Policy):
    """pi0.5: the state as discrete tokens in the prompt, no state token in the expert, critic on the prefix."""

    discrete_proprio = True

    def prompt_suffixes(self, obs: dict[str, torch.Tensor]) -> list[str] | None:
        """'\\nState: b1 b2 ...;\\nAction: ' after the instruction, each normalised state dim in one
        of num_bins bins; kept whole when the prompt is cut to max_text_len (the instruction is cut)."""
        nb = self.cfg.num_bins
        bins = ((self._normalized_state(obs).clamp(-1, 1) + 1) * (0.5 * nb)).floor().long().clamp(0, nb - 1)
        return [f"\nState: {' '.join(map(str, row))};\nAction: " for row in bins.tolist()]
