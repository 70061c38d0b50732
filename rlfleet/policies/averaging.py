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

from rlfleet.policies.checkpoint_io import is_training_checkpoint_name, read_model_config, run_checkpoints
from rlfleet.policies.hub import NORM_STATS, TRAINING_INFO

AVERAGE_FOLDER = "average"


def _check_out(out: Path, folders: Sequence[Path]) -> None:
    """`out` may be new or an earlier average; never a source, a folder holding one, or a run."""
    resolved = out.resolve()
    for folder in folders:
        if folder.resolve() == resolved or resolved in folder.resolve().parents:
            raise ValueError(f"--out {out} holds the checkpoint {folder}: choose a folder of its own")
    if is_training_checkpoint_name(out.name):  # a run's resume and pruning would take it for training's
        raise ValueError(f"--out {out} is named like a training checkpoint: choose another name")
    if out.exists() and "averaged_from" not in _config_or_empty(out):
        raise ValueError(f"--out {out} exists and is not an earlier average: choose a new folder")


def _config_or_empty(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def average_checkpoints(folders: Sequence[str | Path], out: str | Path) -> Path:
    """Write the mean of `folders`' weights as a checkpoint folder `out`: floating tensors averaged
    in float64 (observation-normalisation statistics too, like any weight), others (integer buffers)
    taken from the last folder, which also gives config.json (plus `averaged_from`), norm_stats.json
    and training.json. The folders must hold one policy (equal settings, tensor names, shapes and
    dtypes). Written to a temporary folder first, which then replaces an earlier average at `out`."""
    folders = [Path(f) for f in folders]
    if len(folders) < 2:
        raise ValueError(f"averaging needs two checkpoints or more, got {len(folders)}")
    out = Path(out)
    configs = [read_model_config(f) for f in folders]  # not a checkpoint: one clear FileNotFoundError
    _check_out(out, folders)
    last = configs[-1]
    for folder, config in zip(folders, configs):
        if config.get("policy") != last.get("policy"):
            raise ValueError(
                f"{folder} holds another policy than {folders[-1]}: only checkpoints of one policy average"
            )
    total: dict[str, torch.Tensor] = {}
    layout = None
    for folder in folders:  # one state dict in memory at a time besides the sum
        state = load_file(folder / "model.safetensors")
        theirs = {k: (tuple(t.shape), t.dtype) for k, t in state.items()}
        layout = layout or theirs
        wrong = sorted(k for k in theirs.keys() | layout.keys() if theirs.get(k) != layout.get(k))
        if wrong:
            raise ValueError(f"{folder} and {folders[0]} differ in tensors {wrong[:5]}")
        for name, tensor in state.items():
            if tensor.is_floating_point():
                total[name] = total[name] + tensor.double() if name in total else tensor.double()
    mean = {name: (total[name] / len(folders)).to(t.dtype) if name in total else t for name, t in state.items()}
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(mean, tmp / "model.safetensors")
    sources = [os.path.relpath(f.resolve(), out.resolve().parent) for f in folders]
    (tmp / "config.json").write_text(json.dumps({**last, "averaged_from": sources}, indent=2))
    for name in (NORM_STATS, TRAINING_INFO):
        if (folders[-1] / name).exists():
            shutil.copyfile(folders[-1] / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)  # an earlier average (checked above)
    os.rename(tmp, out)
    return out


def main(args: Namespace) -> int:
    """`rlfleet average RUN [--last K]` or `rlfleet average CKPT CKPT ... --out DIR`."""
    paths = [Path(p) for p in args.paths]
    if args.last < 0:
        raise ValueError(f"--last {args.last}: give a number of checkpoints (0: all the run kept)")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} does not exist")
    if len(paths) == 1:
        if not (paths[0] / "checkpoints").is_dir():
            raise ValueError(
                f"{paths[0]} is not a run folder (no checkpoints/): pass a run folder, "
                "or two checkpoint folders or more and --out"
            )
        folders = run_checkpoints(paths[0])
        if args.last > len(folders):
            raise ValueError(f"{paths[0]} keeps {len(folders)} checkpoints; --last {args.last} asks for more")
        folders = folders[-args.last :] if args.last else folders
        out = Path(args.out) if args.out else paths[0] / "checkpoints" / AVERAGE_FOLDER
    else:
        if args.last:
            raise ValueError("--last picks from a run folder's checkpoints: pass one run folder")
        if not args.out:
            raise ValueError("averaging checkpoint folders needs --out")
        folders, out = paths, Path(args.out)
    average_checkpoints(folders, out)
    print(f"averaged {', '.join(f.name for f in folders)} -> {out}")
    return 0
