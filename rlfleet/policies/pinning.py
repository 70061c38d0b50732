"""A run's policy settings pinned: every hf:// path to one Hub commit, relative local paths made
absolute, so every process of the run (and each checkpoint's config.json) names what the run read.
A resumed run keeps the commit its first life pinned (the run folder's run_spec.json, or its
config.yaml when written before the run spec)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlfleet.policies.checkpoint_io import is_hub_path, parse_hub_path, pin_hub_settings, pin_model_path
from rlfleet.wire.run_spec import read_run_spec


def starting_checkpoint(model_path: str, run_dir: Path, resume: bool) -> str:
    """`model_path` pinned to one Hub commit (`pin_model_path`). A resumed run keeps the commit its
    first life pinned when that names the same Hub repository, so neither its start nor its KL
    reference moves with the branch between lives."""
    path = str(model_path)
    if resume and is_hub_path(path):
        spec = read_run_spec(run_dir)
        previous = spec.model_path if spec is not None else _recorded_model_path(run_dir)
        if previous and is_hub_path(previous) and parse_hub_path(previous)[0] == parse_hub_path(path)[0]:
            path = str(previous)
    return pin_model_path(path)


def _recorded_model_path(run_dir: Path) -> str:
    """A run folder written before the run spec kept the pinned path in its config.yaml."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return ""
    policy = (yaml.safe_load(path.read_text()) or {}).get("policy") or {}
    return str(policy.get("model_path") or "") if isinstance(policy, dict) else ""


def pinned_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A policy's settings (without `model_path`) with every other hf:// setting (a transformers
    backbone, a base checkpoint) pinned to its commit and relative local paths ("./models/x") made
    absolute."""
    pinned = {}
    for key, value in pin_hub_settings(settings).items():
        if isinstance(value, str) and value.startswith(("./", "../")) and Path(value).exists():
            value = str(Path(value).resolve())
        pinned[key] = value
    return pinned


def pinned_policy_settings(policy: dict[str, Any], run_dir: Path, resume: bool) -> dict[str, Any]:
    """A run's `policy` section as its learner builds the policy (the run spec's `policy`):
    `model_path` pinned (`starting_checkpoint`), the other settings pinned (`pinned_settings`)."""
    settings = pinned_settings({k: v for k, v in policy.items() if k != "model_path"})
    if policy.get("model_path"):
        settings["model_path"] = starting_checkpoint(str(policy["model_path"]), run_dir, resume)
    return settings
