"""OpenVLA-OFT on a transformers VLM: K*D learned action queries after the prefix, decoded in
parallel (one forward per chunk).

- `oft_head: bins`: each query's hidden state -> logits over `num_bins` bins of [-1, 1], as
  `tiny_oft` (token / action / chunk log-probs, the same decoders).
- `oft_head: l1`: OpenVLA-OFT's continuous head, each query's hidden state -> one normalised action
  value, trained by L1 regression; for RL a Gaussian with a learned per-token std around it:
      a = mu(o) + sigma eps,  log pi(a | o) = sum log N(a; mu, sigma)  (normalised units, unclamped).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from rlfleet.algorithms.flow import gaussian_log_prob
from rlfleet.policies.hf.backbone import HFPolicyBase
from rlfleet.policies.hf.config import HFVLAConfig
from rlfleet.policies.vla.backbone import masked_mean, mlp
from rlfleet.policies.vla.oft import BinnedHead

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class HFOFTPolicy(BinnedHead, HFPolicyBase):
    """pi(a | o) from the action queries' hidden states (see the module docstring)."""

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg: HFVLAConfig, image_size: int):
        super().__init__(state_dim, action_dim, chunk_size, cfg, image_size)
        width = self.prefix.width
        self.proprio_proj = nn.Linear(cfg.proprio_dims, width) if cfg.proprio_dims else None
        self.action_queries = nn.Parameter(torch.randn(self.num_tokens, width) * 0.02)
        if cfg.oft_head == "bins":
            self.action_head = nn.Linear(width, cfg.num_bins)
            nn.init.normal_(self.action_head.weight, std=0.02)
            nn.init.zeros_(self.action_head.bias)
            nb = cfg.num_bins
            self.register_buffer("bin_centres", -1.0 + (2.0 * torch.arange(nb) + 1.0) / nb, persistent=False)
        else:
            self.action_head = mlp([width, width, 1], out_gain=0.01)
            self.log_std = nn.Parameter(torch.full((self.num_tokens,), float(cfg.init_log_std)))
        self.critic = mlp([width, cfg.critic_width, 1])
        self.record_frozen_base()

    def _forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output per query [B, K*D, num_bins or 1] and the prefix feature [B, C]."""
        out = self.prefix(obs["main_images"], self.texts(obs), self.action_queries, proprio=self._proprio(obs))
        n_prefix = out.valid.shape[1]
        feature = masked_mean(out.hidden[:, :n_prefix], out.valid)
        return self.action_head(out.hidden[:, n_prefix:]).float(), feature

    def _proprio(self, obs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """OpenVLA-OFT's proprio input: the normalised state projected to one prefix token."""
        if self.proprio_proj is None:
            return None
        state = self.norm.normalize_state(obs["states"].to(self.norm.state_q01.dtype))
        return self.proprio_proj(state).unsqueeze(1)  # one proprio token [B, 1, C]

    def _critic(self, feature: torch.Tensor) -> torch.Tensor:
        return self.critic(feature.detach() if self.cfg.critic_detach else feature).squeeze(-1)

    def _log_std(self) -> torch.Tensor:
        return self.log_std.clamp(-5.0, 1.0)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        head, feature = self._forward(obs)
        if self.cfg.oft_head == "bins":
            actions, logp = self.sample_bins(head, deterministic)
        else:
            mean = head.squeeze(-1)
            a_norm = mean.clamp(-1.0, 1.0) if deterministic else mean + self._log_std().exp() * torch.randn_like(mean)
            logp = gaussian_log_prob(a_norm, mean, self._log_std().exp().expand_as(mean))
            actions = self.norm.unnormalize_action(a_norm.reshape(-1, self.chunk_size, self.action_dim))
        return {"actions": actions, "logprobs": self._reduce(logp), "values": self._critic(feature)}

    def evaluate(
        self, obs: dict[str, torch.Tensor], actions: torch.Tensor, extras: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        head, feature = self._forward(obs)
        if self.cfg.oft_head == "bins":
            logp, entropy = self.bins_logp_entropy(head, actions)
        else:
            mean = head.squeeze(-1)
            a_norm = self.norm.normalize_action(
                actions.reshape(actions.shape[0], -1, self.action_dim).to(mean.dtype), clamp=False
            ).reshape(mean.shape)
            logp = gaussian_log_prob(a_norm, mean, self._log_std().exp().expand_as(mean))
            entropy = (0.5 + _HALF_LOG_2PI + self._log_std()).expand_as(mean)
        return self._reduce(logp), self._reduce(entropy), self._critic(feature)

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.prefix(obs["main_images"], self.texts(obs), proprio=self._proprio(obs))
        return self._critic(masked_mean(out.hidden, out.valid))

    def sft_loss(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        """Token cross-entropy of the demo bins (bins head) or L1 to the normalised demo actions (l1)."""
        head, _ = self._forward(obs)
        if self.cfg.oft_head == "bins":
            return F.cross_entropy(head.reshape(-1, self.cfg.num_bins), self.actions_to_bins(actions).reshape(-1))
        target = self.norm.normalize_action(actions.reshape(actions.shape[0], -1, self.action_dim).to(head.dtype))
        return (head.squeeze(-1) - target.reshape(head.shape[0], -1)).abs().mean()
