"""Evaluation: the deterministic policy on fresh episodes of every task, success_once per task."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import make_env


@torch.no_grad()
def evaluate_policy(policy: nn.Module, env_cfg: EnvConfig, episodes_per_task: int, seed: int = 10_000) -> dict[str, float]:
    """Run `episodes_per_task` episodes of each task in one env batch; returns success rate per task."""
    tasks = task_list(env_cfg)
    n = len(tasks) * episodes_per_task
    env = make_env(env_cfg, n)
    try:
        obs = env.reset(np.arange(n) + seed)
        names = env.spec.task_names
        done = np.zeros(n, bool)
        success = np.zeros(n, bool)
        policy.eval()
        while not done.all():
            out = policy.act(torch.from_numpy(obs["states"]), deterministic=True)
            res = env.chunk_step(out["actions"].numpy())
            newly = res.episode_done & ~done
            success[newly] = res.episode_success_once[newly]
            done |= res.episode_done
            obs = res.obs
    finally:
        env.close()
    return {task: float(np.mean([s for s, name in zip(success, names) if name == task])) for task in tasks}


def task_list(env_cfg: EnvConfig) -> list[str]:
    """The distinct tasks of a config, in order (envs are spread over them round-robin)."""
    if env_cfg.name != "metaworld":
        raise ValueError(f"evaluation does not know the task set of env {env_cfg.name!r} yet")
    from rlfleet.envs.metaworld.env import resolve_tasks

    return resolve_tasks(env_cfg.task)
