"""Atomic checkpoints: the policy folder (HF-style) plus trainer state beside it.

Layout: RUN/checkpoints/update_000123/{config.json, model.safetensors, trainer_state.safetensors,
trainer_state.json, training.json} and RUN/checkpoints/latest naming the newest complete one. Each
folder is written under a temp name and renamed, and `latest` is replaced atomically, so a crash
never leaves a half checkpoint.

Trainer state (optimiser, RNG states, counters) is tensors in safetensors plus plain JSON: loading
it runs no pickle code. Checkpoints from before that (trainer_state.pt) still load, through
torch's weights-only unpickler.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from rlfleet.policies.checkpoint_io import run_checkpoints, save_checkpoint_folder

STATE_TENSORS, STATE_JSON, LEGACY_STATE = "trainer_state.safetensors", "trainer_state.json", "trainer_state.pt"
TRAINING_INFO = "training.json"  # how the checkpoint was made: command, commit, counters (the model card reads it)


@dataclass
class TrainerCounters:
    update: int = 0
    version: int = 0
    env_steps: int = 0
    samples: int = 0
    wall_seconds: float = 0.0
    # env steps in rows the updates trained on, and in rows they masked (too old, or left out by
    # the estimator); env_steps less both: counted but in no update yet (rlfleet.learner.trainer)
    trained_env_steps: int = 0
    masked_env_steps: int = 0


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def git_commit() -> str | None:
    """The commit of the rlfleet source tree in use (None for an installed wheel or without git)."""
    src = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def run_info() -> dict[str, Any]:
    """The command that started this training run (`rlfleet train` passes its own to the learner
    it spawns as RLFLEET_COMMAND), the source commit and the rlfleet version."""
    try:
        rlfleet_version = version("rlfleet")
    except PackageNotFoundError:
        rlfleet_version = None
    command = os.environ.get("RLFLEET_COMMAND") or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    return {"command": command, "commit": git_commit(), "rlfleet_version": rlfleet_version}


def _optimizer_to_safe(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimiser state_dict as tensors (`optimizer/<param>/<name>`) plus JSON for the rest."""
    tensors, per_param = {}, {}
    for pid, values in state["state"].items():
        plain = {}
        for name, value in values.items():
            if torch.is_tensor(value):
                tensors[f"optimizer/{pid}/{name}"] = value.detach().cpu().contiguous()
            else:
                plain[name] = value
        per_param[str(pid)] = plain
    return tensors, {"state": per_param, "param_groups": state["param_groups"]}


def _optimizer_from_safe(
    tensors: dict[str, torch.Tensor], meta: dict[str, Any], optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    groups = [
        {k: tuple(v) if isinstance(own.get(k), tuple) else v for k, v in saved.items()}  # JSON made tuples lists
        for saved, own in zip(meta["param_groups"], optimizer.param_groups)
    ]
    state: dict[int, dict[str, Any]] = {int(pid): dict(plain) for pid, plain in meta["state"].items()}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            _, pid, name = key.split("/", 2)
            state.setdefault(int(pid), {})[name] = value
    return {"state": state, "param_groups": groups or meta["param_groups"]}


def _load_legacy_state(path: Path) -> dict[str, Any]:
    """trainer_state.pt of older checkpoints: torch's weights-only unpickler (no arbitrary code),
    allowing the numpy types its numpy RNG state holds."""
    allowed = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    reconstruct = getattr(np, "_core", np.core).multiarray._reconstruct
    with torch.serialization.safe_globals([reconstruct, *allowed]):
        return torch.load(path, weights_only=True)


class Checkpointer:
    def __init__(self, run_dir: Path, keep: int = 3, info: dict[str, Any] | None = None):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep
        self.info = info or {}  # written into each checkpoint as training.json

    def save(
        self,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        counters: TrainerCounters,
        model_config: dict[str, Any],
    ) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        folder = self.root / f"update_{counters.update:06d}"
        save_checkpoint_folder(folder, policy, model_config)
        tensors, optimizer_meta = _optimizer_to_safe(optimizer.state_dict())
        np_state = np.random.get_state(legacy=True)
        if not isinstance(np_state, tuple):  # legacy=True: (name, keys, pos, has_gauss, cached_gaussian)
            raise TypeError(f"numpy's legacy RNG state is a tuple, got {type(np_state).__name__}")
        tensors["rng/torch"] = torch.get_rng_state()
        tensors["rng/numpy"] = torch.from_numpy(np.asarray(np_state[1], np.int64))
        py_version, py_internal, py_gauss = random.getstate()
        meta = {
            "format": 1,
            "optimizer": optimizer_meta,
            "counters": vars(counters).copy(),
            "numpy_rng": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "python_rng": [py_version, list(py_internal), py_gauss],
        }
        save_file(tensors, folder / (STATE_TENSORS + ".tmp"))
        os.replace(folder / (STATE_TENSORS + ".tmp"), folder / STATE_TENSORS)
        _write_atomic(folder / TRAINING_INFO, json.dumps({**self.info, "counters": vars(counters)}, indent=2))
        _write_atomic(folder / STATE_JSON, json.dumps(meta))  # last: its presence marks a complete checkpoint
        _write_atomic(self.root / "latest", folder.name)
        self._prune()
        return folder

    def _prune(self) -> None:
        for old in run_checkpoints(self.root.parent)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def record_published(self, version: int) -> None:
        """Remember the newest version ever published, so a resumed run never reuses a number."""
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.root / "published_version", str(version))

    def published_high_water(self) -> int:
        marker = self.root / "published_version"
        return int(marker.read_text()) if marker.exists() else -1

    def latest(self) -> Path | None:
        marker = self.root / "latest"
        if not marker.exists():
            return None
        folder = self.root / marker.read_text().strip()
        return folder if (folder / STATE_JSON).exists() or (folder / LEGACY_STATE).exists() else None

    def restore(self, folder: Path, policy: nn.Module, optimizer: torch.optim.Optimizer) -> TrainerCounters:
        """Load weights, optimiser, counters and RNG states saved by `save`."""
        policy.load_state_dict(load_file(folder / "model.safetensors"))
        if not (folder / STATE_JSON).exists():
            return self._restore_legacy(folder, optimizer)
        meta = json.loads((folder / STATE_JSON).read_text())
        tensors = load_file(folder / STATE_TENSORS)
        optimizer.load_state_dict(_optimizer_from_safe(tensors, meta["optimizer"], optimizer))
        torch.set_rng_state(tensors["rng/torch"])
        name, pos, has_gauss, cached = meta["numpy_rng"]
        np.random.set_state((name, tensors["rng/numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
        py_version, py_internal, py_gauss = meta["python_rng"]
        random.setstate((py_version, tuple(py_internal), py_gauss))
        return TrainerCounters(**meta["counters"])

    @staticmethod
    def _restore_legacy(folder: Path, optimizer: torch.optim.Optimizer) -> TrainerCounters:
        state = _load_legacy_state(folder / LEGACY_STATE)
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        return TrainerCounters(**state["counters"])
