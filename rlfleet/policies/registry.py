"""Build a policy from its config and the env's dimensions (the one place that knows names)."""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig
from rlfleet.policies.vla import TinyOFTPolicy, TinyPi05Policy, TinyPi0Policy, VLAConfig

POLICIES = {
    "gaussian_mlp": (GaussianMLPPolicy, PolicyConfig),
    "tiny_oft": (TinyOFTPolicy, VLAConfig),
    "tiny_pi0": (TinyPi0Policy, VLAConfig),
    "tiny_pi05": (TinyPi05Policy, VLAConfig),
}


def make_policy(cfg: Mapping[str, Any] | Any, state_dim: int, action_dim: int, chunk_size: int,
                *, image_size: int = 0) -> nn.Module:
    """`image_size` (the env's camera side, 0 = no camera) reaches only policies that read images."""
    is_dc = dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)
    raw = dict(vars(cfg)) if is_dc else OmegaConf.to_container(OmegaConf.create(cfg), resolve=True)
    name = raw.get("name", "gaussian_mlp")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r} (registered: {', '.join(sorted(POLICIES))})")
    cls, cfg_cls = POLICIES[name]
    known = set(cfg_cls.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"policy {name!r} has no settings {sorted(unknown)} (known: {sorted(known)})")
    if "image_size" in inspect.signature(cls).parameters:
        return cls(state_dim, action_dim, chunk_size, cfg_cls(**raw), image_size=image_size)
    return cls(state_dim, action_dim, chunk_size, cfg_cls(**raw))


def check_policy_config(cfg: Mapping[str, Any]) -> None:
    """Type-check a run's `policy` section against its policy's settings (before any process starts)."""
    raw = {k: v for k, v in dict(cfg).items() if k != "model_path"}
    name = raw.get("name", "gaussian_mlp")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r} (registered: {', '.join(sorted(POLICIES))})")
    OmegaConf.merge(OmegaConf.structured(POLICIES[name][1]), raw)
