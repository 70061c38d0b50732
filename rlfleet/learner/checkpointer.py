"""Atomic checkpoints: the policy folder (HF-style) plus trainer state beside it.

Layout: RUN/checkpoints/update_000123/{config.json, model.safetensors, trainer_state.pt} and
RUN/checkpoints/latest naming the newest complete one. Each folder is written under a temp
name and renamed, and `latest` is replaced atomically, so a crash never leaves a half checkpoint.
"""
from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfleet.policies.checkpoint_io import save_checkpoint_folder


@dataclass
class TrainerCounters:
    update: int = 0
    version: int = 0
    env_steps: int = 0
    samples: int = 0
    wall_seconds: float = 0.0


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Checkpointer:
    def __init__(self, run_dir: Path, keep: int = 3):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, policy: nn.Module, optimizer: torch.optim.Optimizer, counters: TrainerCounters,
             model_config: dict[str, Any]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        folder = self.root / f"update_{counters.update:06d}"
        save_checkpoint_folder(folder, policy, model_config)
        state = {
            "optimizer": optimizer.state_dict(),
            "counters": vars(counters).copy(),
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
        }
        tmp = folder / "trainer_state.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, folder / "trainer_state.pt")
        _write_atomic(self.root / "latest", folder.name)
        self._prune()
        return folder

    def _prune(self) -> None:
        folders = sorted(p for p in self.root.glob("update_*") if p.is_dir() and not p.name.endswith((".tmp", ".old")))
        for old in folders[: -self.keep]:
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
        return folder if (folder / "trainer_state.pt").exists() else None

    def restore(self, folder: Path, policy: nn.Module, optimizer: torch.optim.Optimizer) -> TrainerCounters:
        """Load weights, optimiser, counters and RNG states saved by `save`."""
        from safetensors.torch import load_file

        policy.load_state_dict(load_file(folder / "model.safetensors"))
        state = torch.load(folder / "trainer_state.pt", weights_only=False)  # our own local file
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        return TrainerCounters(**state["counters"])
