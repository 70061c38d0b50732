"""Build a policy from its config and the env's dimensions.

`policy.name` is a built-in name, a `package.module:Class` path, or a name an installed package
publishes in the `rlfleet.policies` entry-point group (resolved from the name in every process,
see `rlfleet.envs.plugins`). A policy class takes (state_dim, action_dim, chunk_size, config[,
image_size]) and names its settings dataclass in `config_class` (built-ins pair it below).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from rlfleet.envs.plugins import import_path, resolve

ENTRY_POINT_GROUP = "rlfleet.policies"
# name -> (policy class, settings dataclass) as import paths, imported on first use
_BUILTIN: dict[str, tuple[str, str]] = {
    "gaussian_mlp": ("rlfleet.policies.gaussian_mlp:GaussianMLPPolicy", "rlfleet.policies.gaussian_mlp:PolicyConfig"),
    "tiny_oft": ("rlfleet.policies.vla:TinyOFTPolicy", "rlfleet.policies.vla:VLAConfig"),
    "tiny_pi0": ("rlfleet.policies.vla:TinyPi0Policy", "rlfleet.policies.vla:VLAConfig"),
    "tiny_pi05": ("rlfleet.policies.vla:TinyPi05Policy", "rlfleet.policies.vla:VLAConfig"),
    "hf_oft": ("rlfleet.policies.hf.oft:HFOFTPolicy", "rlfleet.policies.hf:HFVLAConfig"),
    "hf_pi0": ("rlfleet.policies.hf.pi0:HFPi0Policy", "rlfleet.policies.hf:HFVLAConfig"),
    "hf_pi05": ("rlfleet.policies.hf.pi0:HFPi05Policy", "rlfleet.policies.hf:HFVLAConfig"),
}
BUILTIN_POLICIES: tuple[str, ...] = tuple(_BUILTIN)


def policy_classes(name: str) -> tuple[type, type]:
    """(policy class, settings dataclass) of policy `name`; a one-line ValueError when unknown."""
    if name in _BUILTIN:
        cls_path, cfg_path = _BUILTIN[name]
        return import_path(cls_path, "policy"), import_path(cfg_path, "policy")
    cls = resolve(name, "policy", ENTRY_POINT_GROUP, dict.fromkeys(_BUILTIN))
    cfg_cls = getattr(cls, "config_class", None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cfg_cls)):
        raise ValueError(f"policy {name!r} must be a class with a dataclass `config_class` attribute, got {cls!r}")
    return cls, cfg_cls


def _settings(cfg_cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` without `name` when the settings dataclass has no such field (plugin policies)."""
    return raw if "name" in cfg_cls.__dataclass_fields__ else {k: v for k, v in raw.items() if k != "name"}


def _settings_object(raw: dict[str, Any]) -> tuple[str, type, Any]:
    """(name, policy class, settings dataclass instance) of a policy section; an unknown setting is a
    one-line ValueError."""
    name = raw.get("name", "gaussian_mlp")
    cls, cfg_cls = policy_classes(name)
    raw = _settings(cfg_cls, raw)
    known = set(cfg_cls.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"policy {name!r} has no settings {sorted(unknown)} (known: {sorted(known)})")
    return name, cls, cfg_cls(**raw)


def make_policy(
    cfg: Mapping[str, Any] | Any, state_dim: int, action_dim: int, chunk_size: int, *, image_size: int = 0
) -> nn.Module:
    """`image_size` (the env's camera side, 0 = no camera) reaches only policies that read images."""
    is_dc = dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)
    raw = dict(vars(cfg)) if is_dc else OmegaConf.to_container(OmegaConf.create(cfg), resolve=True)
    _, cls, settings = _settings_object(raw)
    if "image_size" in inspect.signature(cls).parameters:
        return cls(state_dim, action_dim, chunk_size, settings, image_size=image_size)
    return cls(state_dim, action_dim, chunk_size, settings)


def complete_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A policy section (without `model_path`) with every default of its settings filled in: what a
    checkpoint's config.json records, so the checkpoint rebuilds the same policy after a default
    changes."""
    name, _, settings = _settings_object(OmegaConf.to_container(OmegaConf.create(dict(cfg)), resolve=True))
    values = dataclasses.asdict(settings)  # nested settings dataclasses as dicts
    recorded = {f.name: values[f.name] for f in dataclasses.fields(settings) if f.init}
    for key, value in recorded.items():
        try:
            json.dumps(value)
        except TypeError:
            raise ValueError(
                f"policy {name!r} setting {key!r} = {value!r} cannot be written to config.json: "
                "settings must be JSON values (numbers, strings, booleans, lists, dicts)"
            ) from None
    return {"name": name, **recorded}


def check_policy_config(cfg: Mapping[str, Any]) -> None:
    """Type-check a run's `policy` section against its policy's settings (before any process starts)."""
    raw = {k: v for k, v in dict(cfg).items() if k != "model_path"}
    name = raw.get("name", "gaussian_mlp")
    cfg_cls = policy_classes(name)[1]
    OmegaConf.merge(OmegaConf.structured(cfg_cls), _settings(cfg_cls, raw))
