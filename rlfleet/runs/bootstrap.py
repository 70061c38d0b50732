"""Start RL from an SFT checkpoint when the run names none: collect demos, behaviour-clone, cache.

This is RLinf's workflow (an SFT checkpoint, then RL) for users who have no checkpoint yet.
Both steps are cached under `demos.cache_dir`, keyed by everything that changes their result,
so the second run of a recipe starts RL at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rlfleet.config import SFTConfig, as_dict, policy_settings
from rlfleet.data.lerobot import is_lerobot_path
from rlfleet.envs.registry import build_env_config, demos_revision
from rlfleet.eval.splits import eval_env_config, evaluation_record, split_seed
from rlfleet.runs.collect import collect_env_demos
from rlfleet.runs.sft import run_sft

log = logging.getLogger(__name__)


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def demos_folder(cfg: DictConfig) -> Path:
    """The run's demo dataset: `demos.path` if given, else a cached collection for its tasks."""
    d = cfg.demos
    if d.path:
        return Path(d.path)  # hf://datasets/... as a Path: is_lerobot_path and the cache key still read it
    env, task = cfg.env, d.task or cfg.env.task
    parts = ["demos", task, env.image_size, env.camera, env.max_episode_steps, d.episodes_per_task, d.seed]
    # Other frames: in the key only with frames and a marker, so older caches stay valid.
    if env.image_size and env.get("goal_marker_size", 0):
        parts.append(["goal_marker_size", env.goal_marker_size])
    if env.image_size and env.get("wrist_camera", False):
        parts.append(["wrist_camera", True])
    revision = demos_revision(env.name)
    if revision:  # the env's demos changed for the same seeds; absent at 0, as above
        parts.append(["demos_revision", revision])
    key = _key(*parts)
    return Path(d.cache_dir) / f"demos-{key}"


# Policy settings that only change how RL samples and scores actions, or how evaluation decodes
# them (applied when the checkpoint is loaded; SFT does not train the exploration parameters some
# of them add, see checkpoint_io.exploration_only), so runs that differ only in them share one
# SFT checkpoint.
SAMPLING_ONLY_KEYS = (
    "temperature",
    "logprob_type",
    "flow_rl",
    "sde_a",
    "noise_min_std",
    "noise_max_std",
    "init_log_std",
    "decode",
)


def sft_folder(cfg: DictConfig) -> Path:
    policy = {k: v for k, v in policy_settings(cfg).items() if k not in SAMPLING_ONLY_KEYS}
    # Where SFT ran changes its result only by rounding: a CPU and a GPU host share the cache key.
    # drop_noop_frames is absent from the key when off, so caches from before it stay valid.
    sft = {k: v for k, v in as_dict(cfg.sft).items() if k != "device" and not (k == "drop_noop_frames" and not v)}
    parts: list[Any] = ["sft", str(demos_folder(cfg)), policy, cfg.env.chunk_size, sft]
    features = as_dict(cfg.demos.get("features", {}))
    if features:  # a LeRobot dataset read another way; absent when empty, so older caches stay valid
        parts.append(["features", features])
    key = _key(*parts)
    return Path(cfg.demos.cache_dir) / f"sft-{key}"


def ensure_sft_checkpoint(cfg: DictConfig, progress: bool = True) -> Path:
    """Collect demos and run SFT unless cached; returns the checkpoint folder."""
    demos, ckpt = demos_folder(cfg), sft_folder(cfg)
    if (ckpt / "model.safetensors").exists():
        log.info("using the cached SFT checkpoint %s", ckpt)
        return ckpt
    if not (demos / "index.json").exists() and not is_lerobot_path(cfg.demos.path or demos):
        if cfg.demos.path:
            raise FileNotFoundError(f"demos.path {demos} holds no demo dataset (index.json)")
        log.info("collecting %d expert demos per task into %s", cfg.demos.episodes_per_task, demos)
        env = build_env_config({**as_dict(cfg.env), "task": cfg.demos.task or cfg.env.task})
        collect_env_demos(demos, env, cfg.demos.episodes_per_task, seed=cfg.demos.seed, progress=progress)
    log.info("behaviour cloning %s on %s -> %s", cfg.policy.get("name"), demos, ckpt)
    sft_cfg = SFTConfig(**as_dict(cfg.sft))
    run_sft(
        cfg.demos.path or demos,  # as written: hf://datasets/... is no local Path
        ckpt,
        policy_settings(cfg),
        build_env_config(as_dict(cfg.env)),
        sft_cfg,
        progress=progress,
        evaluation=evaluation_record(cfg),
        features=as_dict(cfg.demos.features),
        eval_env=eval_env_config(cfg),
        eval_seed=split_seed(cfg.eval),
    )
    return ckpt


def needs_bootstrap(cfg: DictConfig) -> bool:
    return bool(cfg.demos.bootstrap) and not cfg.policy.get("model_path")
