"""A point on a line that must reach a goal: the smallest simulator adapter rlfleet accepts.

Only the per-env hooks are written here; chunking, auto-reset, final observations, reward types,
terminate_on_success, time limits, episode stats and seeds come from `rlfleet.envs.core.EpisodeEnv`.
"""

from __future__ import annotations

import numpy as np

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.core import EpisodeEnv, Outcome, episode_rng


class PointReachEnv(EpisodeEnv):
    """State [position, goal] in [-1, 1]; action: a move of up to 0.1; solved within 0.05 of the goal."""

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        self._init_core(cfg, num_envs, env_offset, state_dim=2, action_dim=1, task_list=["point-reach"])
        self._pos = np.zeros(num_envs)
        self._goal = np.zeros(num_envs)
        self._rngs: list[np.random.Generator | None] = [None] * num_envs

    def reset_one(self, i: int, seed: int | None) -> None:
        rng = episode_rng(self._rngs, i, seed, self._cfg.seed, self._env_offset + i)
        self._pos[i], self._goal[i] = rng.uniform(-1.0, 1.0, 2)

    def step_one(self, i: int, action: np.ndarray) -> Outcome:
        self._pos[i] = np.clip(self._pos[i] + 0.1 * float(action[0]), -1.0, 1.0)
        dist = abs(self._pos[i] - self._goal[i])
        return Outcome(reward=-dist, success=dist < 0.05)

    def state_one(self, i: int) -> np.ndarray:
        return np.array([self._pos[i], self._goal[i]], np.float32)

    def render_one(self, i: int) -> np.ndarray:
        size = self._cfg.image_size  # vertical lines: the goal red, the point white
        frame = np.zeros((size, size, 3), np.uint8)
        frame[:, int((self._goal[i] + 1) / 2 * (size - 1)), 0] = 255
        frame[:, int((self._pos[i] + 1) / 2 * (size - 1))] = 255
        return frame

    def instruction_one(self, i: int) -> str:
        return "move the point to the goal"

    def close(self) -> None:
        self._started = False
