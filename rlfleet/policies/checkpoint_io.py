"""Policy weights as safetensors (on disk and on the wire) and HF-style checkpoint folders.

A checkpoint folder holds config.json (policy config + env dims), model.safetensors and
normalisation stats (they are buffers inside the weights); `load_checkpoint` rebuilds the
policy from the folder alone, so the learner and the inference server load the same path.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load as st_load
from safetensors.torch import load_file, save, save_file
from torch import nn

from rlfleet.policies.registry import complete_settings, make_policy
from rlfleet.wire.run_spec import RunSpec

log = logging.getLogger(__name__)


def cpu_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}


def state_dict_bytes(policy: nn.Module) -> bytes:
    return save(cpu_state_dict(policy))


def checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_state_dict_bytes(policy: nn.Module, data: bytes) -> None:
    """Load weights received over the wire; a shape mismatch is a clear error."""
    load_tensors(policy, st_load(data))


def load_tensors(policy: nn.Module, incoming: dict[str, torch.Tensor], partial: bool = False) -> None:
    """Load all tensors, or with `partial` a subset (a delta from the learner); mismatches are clear errors."""
    _check_compatible(policy, incoming, partial)
    policy.load_state_dict(incoming, strict=not partial)


def exploration_only(policy: nn.Module, names: set[str]) -> set[str]:
    """The names among `names` that only RL exploration trains (a Flow-Noise net, a Gaussian log-std):
    SFT leaves them at their initialisation, so an SFT checkpoint of another `flow_rl` mode still
    starts the run (missing ones keep the fresh init, extra ones are dropped)."""
    prefixes = tuple(getattr(policy, "exploration_parameters", ()))
    return {k for k in names if prefixes and k.startswith(prefixes)}


def _check_compatible(
    policy: nn.Module,
    incoming: dict[str, torch.Tensor],
    partial: bool = False,
    fresh_ok: set[str] | frozenset[str] = frozenset(),
) -> None:
    own = policy.state_dict()
    missing = [] if partial else sorted(set(own) - set(incoming) - set(fresh_ok))
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
                "shape mismatch "
                + ", ".join(f"{k}: {tuple(incoming[k].shape)} vs {tuple(own[k].shape)}" for k in wrong)
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


def model_config(
    policy_cfg: dict[str, Any],
    state_dim: int,
    action_dim: int,
    chunk_size: int,
    env: dict[str, Any] | None = None,
    image_size: int = 0,
    evaluation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """config.json: enough to rebuild the policy (and to know which env it was trained on, and how
    its recipe evaluates it: `evaluation` holds the recipe's eval task, seed and episodes per task,
    so `rlfleet eval` of a checkpoint outside its run folder, an SFT cache or a Hub copy, plays the
    recipe's held-out episodes). The policy settings are recorded whole, as the policy was built (a
    `model_path` checkpoint's settings under the run's) with defaults filled in, so a later change of
    a default does not change what the checkpoint rebuilds."""
    policy_cfg = dict(policy_cfg)
    model_path = policy_cfg.pop("model_path", None)
    if model_path:
        policy_cfg = {**read_model_config(model_path)["policy"], **policy_cfg}
    return {
        "policy": complete_settings(pin_hub_settings(policy_cfg)),
        "state_dim": state_dim,
        "action_dim": action_dim,
        "chunk_size": chunk_size,
        "image_size": image_size,
        "env": env or {},
        **({"evaluation": dict(evaluation)} if evaluation else {}),
    }


HF_PREFIX = "hf://"


def is_hub_path(path: str | os.PathLike) -> bool:
    return str(path).startswith(HF_PREFIX)


def parse_hub_path(path: str) -> tuple[str, str | None]:
    """`hf://org/name[@revision]` -> (repo id, revision or None)."""
    spec = str(path)[len(HF_PREFIX) :]
    repo, _, revision = spec.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"{path}: a Hub checkpoint is hf://ORG/NAME or hf://ORG/NAME@REVISION")
    return repo, revision or None


def resolve_model_path(path: str | os.PathLike) -> Path:
    """A checkpoint folder on disk: a local path as it is, or `hf://org/name[@revision]` downloaded
    through huggingface_hub's cache (HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, the token from HF_TOKEN
    or `hf auth login`); a cached snapshot is not fetched again."""
    if not is_hub_path(path):
        return Path(path)
    repo, revision = parse_hub_path(str(path))
    return hub_snapshot(repo, revision, "model", str(path))


def hub_snapshot(repo: str, revision: str | None, repo_type: str, shown: str) -> Path:
    """The local folder of a Hub repository (`repo_type` model or dataset) at `revision`, through
    huggingface_hub's cache (HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN or `hf auth login`);
    what goes wrong is one FileNotFoundError naming `shown`."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError as exc:  # a core dependency, but an environment may lack it
        raise ValueError(f"{shown}: hf:// paths need huggingface_hub: pip install huggingface_hub") from exc
    try:
        return Path(snapshot_download(repo, repo_type=repo_type, revision=revision))
    except LocalEntryNotFoundError as exc:
        raise FileNotFoundError(
            f"{shown}: not in the local Hugging Face cache and the Hub cannot be reached "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')!r})"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise FileNotFoundError(
            f"{shown}: no such {repo_type} repository on the Hub (or no access: set HF_TOKEN)"
        ) from exc
    except (HfHubHTTPError, OSError) as exc:
        raise FileNotFoundError(f"{shown}: {str(exc).splitlines()[0]}") from exc


def pin_model_path(path: str) -> str:
    """`hf://org/name[@branch or tag]` as `hf://org/name@COMMIT`, the commit it resolves to now
    (the snapshot folder's name in huggingface_hub's cache); a local path as it is.

    Why: a run reads its starting checkpoint several times (the policy, the KL reference,
    config.json, the starting policy's evaluation). Pinned once, every read sees the same files
    (a push to the branch mid-start cannot mix two revisions) and the later reads need no Hub call."""
    if not is_hub_path(path):
        return str(path)
    repo, _ = parse_hub_path(path)
    return f"{HF_PREFIX}{repo}@{resolve_model_path(path).name}"


_COMMIT = re.compile(r"[0-9a-f]{40}")


def pin_hub_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Policy settings with every hf:// value (a backbone, a base checkpoint) pinned to its commit
    (`pin_model_path`), so a checkpoint names the revision it was built on; a value already pinned
    to a commit is kept as it is (no Hub call)."""
    out = dict(settings)
    for key, value in settings.items():
        if isinstance(value, str) and is_hub_path(value):
            revision = parse_hub_path(value)[1]
            if not (revision and _COMMIT.fullmatch(revision)):
                out[key] = pin_model_path(value)
    return out


def checkpoint_folder(path: str | Path) -> Path:
    """The checkpoint a path names: a checkpoint folder, a run folder (its latest checkpoint) or hf://."""
    if is_hub_path(path):
        return resolve_model_path(path)
    folder = Path(path)
    latest = folder / "checkpoints" / "latest"
    if latest.exists():  # a run folder
        folder = folder / "checkpoints" / latest.read_text().strip()
    read_model_config(folder)  # not a checkpoint: one clear FileNotFoundError
    return folder


_CHECKPOINT_NAME = re.compile(r"update_\d+")  # a run's checkpoints, not a crash's .tmp / .old leftovers


def is_training_checkpoint_name(name: str) -> bool:
    return _CHECKPOINT_NAME.fullmatch(name) is not None


def run_checkpoints(run: str | os.PathLike) -> list[Path]:
    """A run folder's checkpoints RUN/checkpoints/update_N, oldest first."""
    root = Path(run) / "checkpoints"
    return sorted(p for p in root.glob("update_*") if is_training_checkpoint_name(p.name) and p.is_dir())


def is_run_folder(path: str | os.PathLike) -> bool:
    """A training run's folder: its config.yaml beside its checkpoints/ (and its evaluation files)."""
    return (Path(path) / "config.yaml").is_file() and (Path(path) / "checkpoints").is_dir()


def run_folder(checkpoint: str | os.PathLike) -> Path | None:
    """RUN for a checkpoint RUN/checkpoints/update_N (where config.yaml and summary.json live), else None."""
    if is_hub_path(checkpoint):
        return None
    checkpoint = Path(checkpoint).resolve()
    run = checkpoint.parent.parent
    return run if checkpoint.parent.name == "checkpoints" and is_run_folder(run) else None


def read_model_config(folder: str | Path) -> dict[str, Any]:
    folder = resolve_model_path(folder)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if not folder.exists():  # a mistyped path: say so, not what a checkpoint folder holds
        raise FileNotFoundError(f"{folder} does not exist")
    if not cfg_path.exists() or not weights.exists():
        raise FileNotFoundError(f"{folder} is not a checkpoint folder (needs config.json and model.safetensors)")
    cfg = json.loads(cfg_path.read_text())
    # A policy setting "./NAME" is a file of the checkpoint itself (an export's merged backbone).
    policy = cfg.get("policy") or {}
    for key, value in policy.items():
        if isinstance(value, str) and value.startswith("./"):
            policy[key] = str(Path(folder).resolve() / value[2:])
    return cfg


def load_checkpoint(folder: str | Path, overrides: Mapping[str, Any] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the policy saved in `folder`; `overrides` change policy settings that keep the weights'
    shapes (sampling temperature, freezing), a shape-changing one is a clear error."""
    folder = resolve_model_path(folder)
    cfg = read_model_config(folder)
    policy_cfg = {**cfg["policy"], **dict(overrides or {})}
    policy = make_policy(
        policy_cfg, cfg["state_dim"], cfg["action_dim"], cfg["chunk_size"], image_size=cfg.get("image_size", 0)
    )
    incoming = load_file(Path(folder) / "model.safetensors")
    own = set(policy.state_dict())
    fresh = exploration_only(policy, own - set(incoming))
    for name in exploration_only(policy, set(incoming) - own):  # e.g. a Flow-Noise SFT start for Flow-SDE
        del incoming[name]
    try:
        _check_compatible(policy, incoming, fresh_ok=fresh)
    except ValueError as exc:
        raise ValueError(f"checkpoint {folder}: {exc}") from exc
    policy.load_state_dict(incoming, strict=not fresh)
    if fresh:
        log.info("%s has no %s: they start from their initialisation", folder, sorted(fresh))
    cfg["policy"] = policy_cfg
    return policy, cfg


def policy_from_config(
    policy_cfg: Mapping[str, Any], state_dim: int, action_dim: int, chunk_size: int, image_size: int = 0
) -> nn.Module:
    """A fresh policy, or with `model_path` set the checkpoint's (a folder or hf://org/name[@revision]),
    checked against the run's env."""
    policy_cfg = dict(policy_cfg)
    model_path = policy_cfg.pop("model_path", None)
    if not model_path:
        return make_policy(policy_cfg, state_dim, action_dim, chunk_size, image_size=image_size)
    saved = read_model_config(model_path)
    want = {"state_dim": state_dim, "action_dim": action_dim, "chunk_size": chunk_size, "image_size": image_size}
    got = {k: saved.get(k, 0) for k in want}
    if got != want:
        diff = ", ".join(f"{k} {got[k]} (run needs {want[k]})" for k in want if got[k] != want[k])
        raise ValueError(f"checkpoint {model_path} does not fit this run: {diff}")
    name = policy_cfg.pop("name", None)
    if name and name != saved["policy"].get("name"):
        raise ValueError(
            f"checkpoint {model_path} holds a {saved['policy'].get('name')!r} policy, the run config asks for {name!r}"
        )
    policy, _ = load_checkpoint(model_path, overrides=policy_cfg)
    log.info("loaded policy weights from %s", model_path)
    return policy


def reference_policy(cfg: Any, spec: RunSpec, policy: nn.Module) -> nn.Module | None:
    """The frozen policy RL is kept near (`algorithm.kl_beta` > 0): the checkpoint at the run spec's
    `model_path` (the SFT policy, also after a resume), else a copy of the fresh weights."""
    if not cfg.algorithm.get("kl_beta", 0.0):
        return None
    if not spec.model_path:
        return copy.deepcopy(policy)
    reference = policy_from_config(spec.policy, spec.state_dim, spec.action_dim, cfg.env.chunk_size, cfg.env.image_size)
    with safe_open(resolve_model_path(spec.model_path) / "model.safetensors", framework="pt") as f:
        saved = set(f.keys())
    own = policy.state_dict()
    fresh = exploration_only(reference, set(own) - saved)
    reference.load_state_dict({k: own[k] for k in fresh}, strict=False)  # the same start as the trained copy
    return reference
