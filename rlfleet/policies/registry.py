"""Build a policy from its config and the env's dimensions (the one place that knows names)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig

POLICIES = {"gaussian_mlp": (GaussianMLPPolicy, PolicyConfig)}


def make_policy(cfg: Mapping[str, Any] | PolicyConfig, state_dim: int, action_dim: int, chunk_size: int) -> nn.Module:
    raw = OmegaConf.to_container(OmegaConf.create(cfg), resolve=True) if not isinstance(cfg, PolicyConfig) else vars(cfg)
    name = raw.get("name", "gaussian_mlp")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r} (registered: {', '.join(sorted(POLICIES))})")
    cls, cfg_cls = POLICIES[name]
    known = set(cfg_cls.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"policy {name!r} has no settings {sorted(unknown)} (known: {sorted(known)})")
    return cls(state_dim, action_dim, chunk_size, cfg_cls(**raw))
