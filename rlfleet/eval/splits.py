"""Held-out splits: the env a run's evaluation plays (its `eval_env` section in the split's
held-out form), the episode seeds each split starts from, the start check that keeps splits,
training and demos apart, and what a checkpoint records of how its recipe evaluates."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlfleet.config import EvalConfig, as_dict
from rlfleet.data.demos import DEMO_SEED_BASE
from rlfleet.envs.api import EVAL_SPLITS, EnvConfig
from rlfleet.envs.registry import build_env_config, check_held_out_splits


def eval_env_config(cfg: DictConfig, split: str | None = None) -> EnvConfig:
    """The env a run's evaluation plays: its `eval_env` section (the train env's settings unless
    the recipe sets some, e.g. held-out tasks) in the held-out form of `split` (default
    `eval.split`; `EnvConfig.held_out`: CALVIN's chain pool, RoboTwin's seed files)."""
    return build_env_config(as_dict(cfg.eval_env)).held_out(split or cfg.eval.split)


def split_seed(evaluation: Any, split: str | None = None) -> int:
    """The first episode seed of a held-out split (default the section's `split`) of an `eval`
    section: a run's, or the EvalConfig a checkpoint records."""
    split = split or evaluation.split
    if split not in EVAL_SPLITS:
        raise ValueError(f"evaluation split must be one of {', '.join(EVAL_SPLITS)}, got {split!r}")
    return int(evaluation.seed if split == "test" else evaluation.validation_seed)


def eval_seed_range(cfg: DictConfig, num_tasks: int, split: str | None = None) -> range:
    """The episode seeds evaluation on `split` (default `eval.split`) uses
    (`rlfleet.eval.episodes.evaluate_policy`: seed + j * tasks + i), after the start check.

    Held out by construction: demo seeds start at DEMO_SEED_BASE, above both splits' ranges
    (checked here), and training envs draw episodes from their own streams
    (`rlfleet.envs.core.TRAIN_STREAM`), or after a resume from integer seeds at or above
    `RESUMED_SEED_BASE`, so no training run replays them. The test and validation ranges must not
    meet (checked here), nor the env's own held-out sets (CALVIN's chain pools, RoboTwin's seed
    files: `ChunkedEnv.check_held_out_splits`); each refusal is one line (ValueError)."""
    episodes = max(cfg.eval.episodes_per_task, cfg.eval.periodic_episodes_per_task)
    ranges = {}
    for name in EVAL_SPLITS:
        start = split_seed(cfg.eval, name)
        ranges[name] = seeds = range(start, start + episodes * num_tasks)
        if seeds.start < 0 or seeds.stop > DEMO_SEED_BASE:
            raise ValueError(
                f"{name} eval seeds {seeds.start}..{seeds.stop - 1} must lie in [0, {DEMO_SEED_BASE}) "
                "where no demo episode starts"
            )
    test, val = ranges["test"], ranges["validation"]
    if test.start < val.stop and val.start < test.stop:
        raise ValueError(
            f"validation eval seeds {val.start}..{val.stop - 1} overlap the test eval seeds "
            f"{test.start}..{test.stop - 1}: set eval.validation_seed apart from eval.seed"
        )
    check_held_out_splits(eval_env_config(cfg, "test"), test, val)
    return ranges[split or cfg.eval.split]


# What a checkpoint's config.json records of how its recipe evaluates (`evaluation_record`):
# the eval env's task ("task", a name checkpoints have always used) and these `eval` keys.
EVALUATION_KEYS = ("seed", "validation_seed", "episodes_per_task")


def evaluation_record(cfg: DictConfig) -> dict[str, Any]:
    """How a recipe evaluates its policies, as a checkpoint's config.json records it."""
    return {"task": cfg.eval_env.task, **{key: cfg.eval[key] for key in EVALUATION_KEYS}}


def checkpoint_eval_config(meta: dict[str, Any]) -> EvalConfig:
    """The evaluation a checkpoint's config.json records (`evaluation_record`), else the defaults
    (checkpoints written before it was recorded)."""
    recorded = meta.get("evaluation") or {}
    return EvalConfig(**{key: recorded[key] for key in EVALUATION_KEYS if key in recorded})


def checkpoint_eval_task(meta: dict[str, Any]) -> str:
    """The task a checkpoint's config.json records its recipe evaluates on ("": its env's own)."""
    return str((meta.get("evaluation") or {}).get("task", ""))
