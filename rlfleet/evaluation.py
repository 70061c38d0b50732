"""Evaluation: the deterministic policy on fresh episodes of every task, success_once per task."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import make_env


@torch.no_grad()
def evaluate_policy(policy: nn.Module, env_cfg: EnvConfig, episodes_per_task: int, seed: int = 10_000,
                    video_cfg=None, out_dir: str | Path | None = None) -> dict[str, float]:
    """Run `episodes_per_task` episodes of each task in one env batch; returns success rate per task.

    Episode i uses seed `seed + i`, so every evaluation of a task set sees the same episodes.
    With `video_cfg.save_video` the first episodes of each task are written as MP4 under `out_dir`.
    """
    from rlfleet.eval_video import EpisodeRecorder, VideoConfig

    tasks = task_list(env_cfg)
    n = len(tasks) * episodes_per_task
    env = make_env(env_cfg, n)
    recorder = None
    try:
        obs = env.reset(np.arange(n) + seed)
        names = env.spec.task_names
        recorder = EpisodeRecorder(video_cfg or VideoConfig(), names, root=out_dir, episodes_per_env=1)
        recorder.start(obs.get("main_images"))
        done = np.zeros(n, bool)
        success = np.zeros(n, bool)
        policy.eval()
        while not done.all():
            out = policy.act(obs_tensors(obs, policy.obs_keys), deterministic=True)
            res = env.chunk_step(out["actions"].numpy())
            recorder.step(res.obs.get("main_images"), rewards=res.rewards, success=res.success, done=res.episode_done,
                          final_frames=res.final_obs.get("main_images"), episode_success=res.episode_success_once,
                          episode_length=res.episode_length)
            newly = res.episode_done & ~done
            success[newly] = res.episode_success_once[newly]
            done |= res.episode_done
            obs = res.obs
    finally:
        if recorder is not None:
            recorder.close()
        env.close()
    return {task: float(np.mean([s for s, name in zip(success, names) if name == task])) for task in tasks}


def obs_tensors(obs: dict, keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The tensor observations a policy reads, from an env's observation dict."""
    return {k: torch.from_numpy(np.ascontiguousarray(obs[k])) for k in keys}


def task_list(env_cfg: EnvConfig) -> list[str]:
    """The distinct tasks of a config, in order (envs are spread over them round-robin)."""
    if env_cfg.name != "metaworld":
        raise ValueError(f"evaluation does not know the task set of env {env_cfg.name!r} yet")
    from rlfleet.envs.metaworld.env import resolve_tasks

    return resolve_tasks(env_cfg.task)
