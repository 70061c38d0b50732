"""Uniform weight averaging of checkpoints of one run (`rlfleet average`).

The kept checkpoints of an RL fine-tuning run lie close together on one trajectory from the same
start, so the mean of their weights is itself a policy (Izmailov et al. 2018, stochastic weight
averaging; Kaddour 2022, latest weight averaging). It smooths the episode-by-episode trading a
single late checkpoint shows (docs/algorithms.md, "Averaging the last checkpoints").
"""

from __future__ import annotations

import json
import os
import shutil
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlfleet.policies.checkpoint_io import read_model_config

AVERAGE_FOLDER = "average"
NORM_STATS = "norm_stats.json"


def run_checkpoints(run: Path) -> list[Path]:
    """A run folder's kept checkpoints, oldest first."""
    root = Path(run) / "checkpoints"
    return sorted(p for p in root.glob("update_*") if p.is_dir() and (p / "model.safetensors").exists())


def average_checkpoints(folders: Sequence[str | Path], out: str | Path) -> Path:
    """Write the mean of `folders`' weights as a checkpoint folder `out` (atomically): floating
    tensors averaged in float64, others (integer buffers) taken from the last folder, which also
    gives config.json (plus `averaged_from`) and norm_stats.json. The folders must hold the same
    policy (equal policy settings and tensor shapes)."""
    folders = [Path(f) for f in folders]
    if len(folders) < 2:
        raise ValueError(f"averaging needs two checkpoints or more, got {len(folders)}")
    configs = [read_model_config(f) for f in folders]  # not a checkpoint: one clear FileNotFoundError
    last = configs[-1]
    for folder, config in zip(folders, configs):
        if config.get("policy") != last.get("policy"):
            raise ValueError(f"{folder} holds another policy than {folders[-1]}: only one run's checkpoints average")
    states = [load_file(f / "model.safetensors") for f in folders]
    for folder, state in zip(folders, states):
        wrong = sorted(k for k in state.keys() ^ states[-1].keys()) + sorted(
            k for k in state.keys() & states[-1].keys() if state[k].shape != states[-1][k].shape
        )
        if wrong:
            raise ValueError(f"{folder} and {folders[-1]} differ in tensors {wrong[:5]}")
    mean = {
        name: torch.stack([s[name].double() for s in states]).mean(0).to(t.dtype) if t.is_floating_point() else t
        for name, t in states[-1].items()
    }
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(mean, tmp / "model.safetensors")
    sources = [os.path.relpath(f.resolve(), out.resolve().parent) for f in folders]
    (tmp / "config.json").write_text(json.dumps({**last, "averaged_from": sources}, indent=2))
    if (folders[-1] / NORM_STATS).exists():
        shutil.copyfile(folders[-1] / NORM_STATS, tmp / NORM_STATS)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


def main(args: Namespace) -> int:
    """`rlfleet average RUN [--last K]` or `rlfleet average CKPT CKPT ... --out DIR`."""
    paths = [Path(p) for p in args.paths]
    if len(paths) == 1 and (paths[0] / "checkpoints").is_dir():  # a run folder: its kept checkpoints
        folders = run_checkpoints(paths[0])
        folders = folders[-args.last :] if args.last else folders
        out = Path(args.out) if args.out else paths[0] / "checkpoints" / AVERAGE_FOLDER
    else:
        if args.last:
            raise ValueError("--last picks from a run folder's checkpoints: pass one run folder")
        if not args.out:
            raise ValueError("averaging checkpoint folders needs --out")
        folders, out = paths, Path(args.out)
    if out.resolve() in {f.resolve() for f in folders}:
        raise ValueError(f"--out {out} is one of the checkpoints averaged")
    average_checkpoints(folders, out)
    print(f"averaged {', '.join(f.name for f in folders)} -> {out}")
    return 0
