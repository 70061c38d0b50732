"""Solvable episode seeds: found by running the scripted expert, shipped as small train/eval/validation files.

Why: RoboTwin trains and evaluates only on layouts its expert can solve (some random layouts put
objects out of reach or in each other's way). `seeds/<task>_<split>.json` maps each setting to a
list of scene seeds; train seeds are drawn from 0, 1, 2, ..., eval (test) seeds from 1_000_000 on
and validation seeds (for choices made by looking at success) from 2_000_000 on, so the splits
are disjoint by construction (`check_splits_disjoint` checks the files). Regenerate with
`python -m rlfleet.envs.robotwin.seeds --train 50 --eval 20 --validation 20` (about a minute per
task and setting; `--splits validation` regenerates one split only).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.robotwin.settings import SETTINGS
from rlfleet.envs.robotwin.tasks import TASKS

SEED_DIR = Path(__file__).parent / "seeds"
SPLITS = ("train", "eval", "validation", "any")  # "any": raw seeds, not filtered by the expert
SPLIT_BASE = {"train": 0, "eval": 1_000_000, "validation": 2_000_000}
HELD_OUT_SPLITS = ("eval", "validation")  # layouts no training or demo episode plays
# Split `any` plays raw seed s + HELD_OUT_SHIFT where s is a shipped eval or validation seed of its
# task and setting: demo collection's seeds (1_000_000 up) would otherwise replay the held-out layouts.
HELD_OUT_SHIFT = 2**40
EXPERT_STEPS = 300  # expert episodes longer than this count as unsolved


@functools.cache
def _read(task: str, split: str) -> dict[str, list[int]]:
    path = SEED_DIR / f"{task}_{split}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no seed file {path}; generate it with `python -m rlfleet.envs.robotwin.seeds "
            f"--tasks {task}` or use split 'any' (e.g. '{task}:any')"
        )
    with path.open() as f:
        return json.load(f)


def load_seeds(task: str, split: str, setting: str) -> list[int]:
    """The expert-solvable seeds of one task, split ('train' / 'eval') and setting."""
    seeds = _read(task, split).get(setting)
    if not seeds:
        raise FileNotFoundError(f"seed file {task}_{split}.json has no seeds for setting {setting!r}")
    return list(seeds)


def held_out_seeds(task: str, setting: str) -> frozenset[int]:
    """The eval and validation splits' seeds of one task and setting (empty without their files):
    the layouts split `any` never plays."""
    out: set[int] = set()
    for split in HELD_OUT_SPLITS:
        try:
            out.update(_read(task, split).get(setting, []))
        except FileNotFoundError:
            pass
    return frozenset(out)


def check_splits_disjoint(task: str, setting: str) -> None:
    """One line (ValueError) if two shipped seed files of a task and setting share a layout."""
    seen: dict[int, str] = {}
    for split in ("train", *HELD_OUT_SPLITS):
        try:
            seeds = _read(task, split).get(setting, [])
        except FileNotFoundError:
            continue
        for seed in seeds:
            if seed in seen and seen[seed] != split:
                raise ValueError(
                    f"RoboTwin {task}:{setting}: seed {seed} is in both the {seen[seed]} and the {split} seed files"
                )
            seen[seed] = split


def expert_solves(task: str, setting: str, seed: int, max_steps: int = EXPERT_STEPS) -> tuple[bool, int]:
    """Run the scripted expert on the episode of raw `seed`; (solved, steps it took)."""
    from rlfleet.envs.robotwin.env import RoboTwinEnv  # robotwin.env imports this module

    cfg = EnvConfig(
        name="robotwin", task=f"{task}:{setting}:any", max_episode_steps=max_steps + 1, reward_type="success"
    )
    env = RoboTwinEnv(cfg, 1, allow_held_out=True)  # the eval search tries raw eval seeds
    try:
        env.reset(np.array([seed]))
        for t in range(max_steps):
            res = env.chunk_step(env.expert_actions()[:, None, :])
            if res.success[0]:
                return True, t + 1
        return False, max_steps
    finally:
        env.close()


def find_solvable_seeds(
    task: str, setting: str, candidates: Iterable[int], count: int, max_steps: int = EXPERT_STEPS
) -> tuple[list[int], int]:
    """The first `count` candidates the expert solves, and how many candidates were tried."""
    found, tried = [], 0
    for seed in candidates:
        tried += 1
        if expert_solves(task, setting, int(seed), max_steps)[0]:
            found.append(int(seed))
            if len(found) == count:
                break
    return found, tried


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--train", type=int, default=50)
    ap.add_argument("--eval", type=int, default=20)
    ap.add_argument("--validation", type=int, default=20)
    ap.add_argument("--splits", default="train,eval,validation", help="the seed files to (re)write")
    args = ap.parse_args(argv)
    SEED_DIR.mkdir(exist_ok=True)
    counts = {"train": args.train, "eval": args.eval, "validation": args.validation}
    for task in args.tasks.split(","):
        for split, count in ((s, counts[s]) for s in args.splits.split(",")):
            out: dict[str, list[int]] = {}
            for setting in args.settings.split(","):
                base = SPLIT_BASE[split]
                out[setting], tried = find_solvable_seeds(task, setting, range(base, base + 20 * count), count)
                print(f"{task} {setting} {split}: {len(out[setting])}/{tried} solvable", flush=True)
            (SEED_DIR / f"{task}_{split}.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
