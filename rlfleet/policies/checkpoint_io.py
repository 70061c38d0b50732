"""Policy weights as safetensors (on disk and on the wire) and HF-style checkpoint folders.

A checkpoint folder holds config.json (policy config + env dims), model.safetensors and
normalisation stats (they are buffers inside the weights); `load_checkpoint` rebuilds the
policy from the folder alone, so the learner and the inference server load the same path.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import load_file, save, save_file
from torch import nn

from rlfleet.policies.registry import make_policy


def state_dict_bytes(policy: nn.Module) -> bytes:
    tensors = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    return save(tensors)


def checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_state_dict_bytes(policy: nn.Module, data: bytes) -> None:
    """Load weights received over the wire; a shape mismatch is a clear error."""
    incoming = st_load(data)
    _check_compatible(policy, incoming)
    policy.load_state_dict(incoming)


def _check_compatible(policy: nn.Module, incoming: dict[str, torch.Tensor]) -> None:
    own = policy.state_dict()
    missing = sorted(set(own) - set(incoming))
    extra = sorted(set(incoming) - set(own))
    wrong = sorted(k for k in set(own) & set(incoming) if own[k].shape != incoming[k].shape)
    if missing or extra or wrong:
        details = []
        if missing:
            details.append(f"missing {missing}")
        if extra:
            details.append(f"unexpected {extra}")
        if wrong:
            details.append(
                "shape mismatch " + ", ".join(f"{k}: {tuple(incoming[k].shape)} vs {tuple(own[k].shape)}" for k in wrong)
            )
        raise ValueError("weights do not fit this policy: " + "; ".join(details))


def save_checkpoint_folder(folder: Path, policy: nn.Module, model_config: dict[str, Any]) -> None:
    """Write config.json + model.safetensors into `folder` atomically (temp dir, then rename)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}, tmp / "model.safetensors")
    (tmp / "config.json").write_text(json.dumps(model_config, indent=2))
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(folder, old)
        os.rename(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, folder)


def model_config(policy_cfg: dict[str, Any], state_dim: int, action_dim: int, chunk_size: int,
                 env: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json: enough to rebuild the policy (and to know which env it was trained on)."""
    return {"policy": policy_cfg, "state_dim": state_dim, "action_dim": action_dim, "chunk_size": chunk_size,
            "env": env or {}}


def load_checkpoint(folder: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    folder = Path(folder)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.exists() or not weights.exists():
        raise FileNotFoundError(f"{folder} is not a checkpoint folder (needs config.json and model.safetensors)")
    cfg = json.loads(cfg_path.read_text())
    policy = make_policy(cfg["policy"], cfg["state_dim"], cfg["action_dim"], cfg["chunk_size"])
    incoming = load_file(weights)
    _check_compatible(policy, incoming)
    policy.load_state_dict(incoming)
    return policy, cfg
