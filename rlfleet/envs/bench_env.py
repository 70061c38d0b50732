"""`env.name=bench`: a simulator whose step costs (almost) nothing, to measure the fleet's own overhead.

Sizes come from `EnvConfig`: `chunk_size`, `image_size` (frames are a preallocated buffer, not
rendered) and `max_episode_steps`; the rest from `EnvConfig.task`, comma-separated items:
`key=value` settings and plain task labels (default one task, "bench"):

    state_dim=39     floats in `states`
    action_dim=4     action size
    busy_us=0        busy-wait this many microseconds per env step (a simulator of that cost)

e.g. `env.task="state_dim=39,action_dim=4,busy_us=500"` or `env.task="a,b,state_dim=8"`.

Dynamics (cheap, but a real task so the env passes the contract and PPO can learn it): the first
k = min(state_dim, action_dim) state entries are a point that each action moves by 0.1 x action,
the rest is constant noise; dense reward = minus the point's distance to 0; success within 0.1.
Every episode starts from a uniform draw in [-1, 1] from the env's own seeded generator.
What remains per env step is the episode core's bookkeeping (a few microseconds of Python).
"""

from __future__ import annotations

import time

import numpy as np

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.core import EpisodeEnv, Outcome, episode_rng

_SETTINGS = {"state_dim": 39, "action_dim": 4, "busy_us": 0}


def parse_task(task: str) -> tuple[list[str], dict[str, int]]:
    """(task labels, settings) of a bench env's `EnvConfig.task`; a one-line ValueError when bad."""
    labels, settings = [], dict(_SETTINGS)
    for item in (t.strip() for t in task.split(",")):
        if not item:
            continue
        if "=" not in item:
            labels.append(item)
            continue
        key, _, value = item.partition("=")
        if key.strip() not in _SETTINGS:
            raise ValueError(f"bench env setting {key.strip()!r} unknown; settings: {', '.join(_SETTINGS)}")
        try:
            settings[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"bench env setting {item!r} must be an integer") from None
    if settings["state_dim"] < 1 or settings["action_dim"] < 1 or settings["busy_us"] < 0:
        raise ValueError(f"bench env needs state_dim >= 1, action_dim >= 1, busy_us >= 0, got {settings}")
    return labels or ["bench"], settings


class BenchEnv(EpisodeEnv):
    """The zero-cost benchmark env (see the module docstring)."""

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        labels, settings = parse_task(cfg.task)
        S, A = settings["state_dim"], settings["action_dim"]
        self._init_core(cfg, num_envs, env_offset, S, A, labels)
        self._k = min(S, A)
        self._busy_ns = settings["busy_us"] * 1000
        self._state = np.zeros((num_envs, S), np.float32)
        self._rngs: list[np.random.Generator | None] = [None] * num_envs
        size = cfg.image_size
        self._frames = np.zeros((num_envs, size, size, 3), np.uint8) if size else None

    @classmethod
    def config_tasks(cls, cfg: EnvConfig) -> list[str]:
        return parse_task(cfg.task)[0]

    def reset_one(self, i: int, seed: int | None) -> None:
        rng = episode_rng(self._rngs, i, seed, self._cfg.seed, self._env_offset + i)
        self._state[i] = rng.uniform(-1.0, 1.0, self._state.shape[1])

    def step_one(self, i: int, action: np.ndarray) -> Outcome:
        if self._busy_ns:
            end = time.perf_counter_ns() + self._busy_ns
            while time.perf_counter_ns() < end:
                pass
        point = self._state[i, : self._k]
        point += 0.1 * action[: self._k]
        dist = float(np.sqrt(point @ point))
        return Outcome(-dist, dist < 0.1)

    def state_one(self, i: int) -> np.ndarray:
        return self._state[i]

    def render_one(self, i: int) -> np.ndarray:
        assert self._frames is not None
        self._frames[i, 0, 0, 0] = self._ep_length[i] % 256  # a frame that changes, never rendered
        return self._frames[i]

    def close(self) -> None:
        self._started = False
