"""Any gymnasium env with a Box action space as a `ChunkedEnv`: `env.name=gym:<id>`.

`gym:InvertedPendulum-v5` makes a registered id; `gym:package.module:Id-v0` imports
`package.module` first (gymnasium's own `module:id` syntax), so a package that registers its envs
on import needs no other glue. One gymnasium env per batch slot, stepped by the shared episode
core (`rlfleet.envs.core.EpisodeEnv`): gymnasium's vector envs auto-reset with their own rules, the
core keeps the final observation and the stats the same way for every simulator.

Mapping:
* Arguments: `EnvConfig.gym_kwargs` go to `gym.make` in every process that makes the env.
* Observations: a Box becomes `states` (flattened, float32). A Dict (nested Dicts flattened) puts its
  first image-like entry (uint8 [H, W, 3]) into `main_images` and the other entries, flattened in
  key order, into `states`. With `image_size` > 0 and no image entry, frames come from `render()` (rgb_array).
  Frames of another size are resized by nearest-neighbour sampling. MuJoCo envs render without
  shadows and multisampling unless `EnvConfig.gym_render_quality` is "env" (see `fast_rendering`).
* Actions: the policy's [-1, 1] are rescaled to the Box bounds (dims with infinite bounds pass through).
* Episode ends: gymnasium's `terminated` is termination, its `truncated` (the TimeLimit wrapper)
  is truncation; `EnvConfig.max_episode_steps` truncates as well, whichever comes first.
* Success: `info[EnvConfig.success_key]` when set, else `info["is_success"]` or `info["success"]`
  when present (else never); a key absent from `info` through the first episodes is warned about.
* Tasks: one, the id without its module (`gym:pkg.mod:Id-v0` -> `Id-v0`).
* Seeds: `reset(seeds)` seeds env i's gymnasium `reset(seed=...)`; without seeds the
  first reset seeds it from (cfg.seed, global index) and later ones continue its RNG.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import numpy as np

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.core import EpisodeEnv, Outcome
from rlfleet.envs.gymnasium_config import GymEnvConfig

PREFIX = "gym:"
SUCCESS_KEY_EPISODES = 3  # episodes ended before a success key never seen in `info` is warned about
log = logging.getLogger(__name__)
# MuJoCo envs render offscreen without a display through EGL (Mesa's llvmpipe on CPU); must be set
# before mujoco is first imported, a user's setting wins.
os.environ.setdefault("MUJOCO_GL", "egl")


def gym_id(name: str) -> str:
    """The gymnasium id of an env name `gym:<id>`."""
    if not name.startswith(PREFIX) or not name[len(PREFIX) :]:
        raise ValueError(f"a gymnasium env name is 'gym:<id>' or 'gym:package.module:<id>', got {name!r}")
    return name[len(PREFIX) :]


def _make(env_id: str, image_size: int, kwargs: dict[str, Any]) -> Any:
    """gymnasium's env (its checker off: it re-validates every step) with the user's `gym_kwargs`;
    rendering envs are asked for frames of `image_size` when they take width/height (MuJoCo's do),
    else frames are resized."""
    import gymnasium as gym  # optional: the [gym] extra (rlfleet.envs imports without it)

    try:
        if not image_size:
            return gym.make(env_id, disable_env_checker=True, **kwargs)
        render = {"render_mode": "rgb_array", "width": image_size, "height": image_size}
        try:
            return gym.make(env_id, disable_env_checker=True, **{**render, **kwargs})
        except TypeError as exc:  # no width/height arguments
            if not any(k in str(exc) for k in ("width", "height")):
                raise ValueError(f"gymnasium cannot make {env_id!r} with env.gym_kwargs={kwargs}: {exc}") from None
            return gym.make(env_id, disable_env_checker=True, **{"render_mode": "rgb_array", **kwargs})
    except TypeError as exc:  # a gym_kwargs key the env does not take
        raise ValueError(f"gymnasium cannot make {env_id!r} with env.gym_kwargs={kwargs}: {exc}") from None
    except gym.error.Error as exc:
        raise ValueError(f"gymnasium cannot make {env_id!r}: {exc}") from None
    except ModuleNotFoundError as exc:
        raise ValueError(f"gymnasium cannot make {env_id!r}: {exc}") from None


def fast_rendering(env: Any) -> int:
    """Shadows and multisampling off in a MuJoCo env's models (every MjModel attribute of the
    unwrapped env: gymnasium's `model`, other packages' `_model`); returns how many were changed.
    Must run before the env's first render: MuJoCo reads the sample count when it makes the GL
    context. Envs of other simulators are left alone (mujoco not imported: none to change)."""
    mujoco = sys.modules.get("mujoco")  # imported by the env itself when it is a MuJoCo env
    if mujoco is None:
        return 0
    models = [v for v in vars(env.unwrapped).values() if isinstance(v, mujoco.MjModel)]
    for model in models:
        model.vis.quality.offsamples = 0
        model.light_castshadow[:] = 0
    return len(models)


def task_name(env_id: str) -> str:
    """The task an id names: the id without the module gymnasium imports first
    (`package.module:Id-v0` -> `Id-v0`), so tables and metric tags read the same either way."""
    return env_id.rsplit(":", 1)[-1]


def _leaves(space: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """A Dict space's Box entries in key order, nested Dicts flattened to dotted paths."""
    from gymnasium import spaces  # optional: the [gym] extra

    out: list[tuple[str, Any]] = []
    for key, sub in space.spaces.items():
        if isinstance(sub, spaces.Dict):
            out += _leaves(sub, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", sub))
    return out


def _get(obs: Any, path: str) -> Any:
    for key in path.split("."):
        obs = obs[key]
    return obs


def _image_key(leaves: list[tuple[str, Any]]) -> str | None:
    from gymnasium import spaces  # optional: the [gym] extra

    for key, sub in leaves:
        if isinstance(sub, spaces.Box) and sub.dtype == np.uint8 and len(sub.shape) == 3 and sub.shape[-1] == 3:
            return key
    return None


def _resize(frame: np.ndarray, size: int) -> np.ndarray:
    """Nearest-neighbour resize of an [H, W, 3] frame to [size, size, 3] (no copy when already that size)."""
    h, w = frame.shape[:2]
    if h == size and w == size:
        return frame
    rows = (np.arange(size) * h // size).astype(np.intp)
    cols = (np.arange(size) * w // size).astype(np.intp)
    return frame[rows][:, cols]


class GymEnv(EpisodeEnv):
    """A batch of gymnasium envs of one id behind the chunked, auto-resetting API."""

    CONFIG_CLASS = GymEnvConfig
    _cfg: GymEnvConfig

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        from gymnasium import spaces  # optional: the [gym] extra

        cfg = GymEnvConfig.of(cfg)
        env_id = gym_id(cfg.name)
        kwargs = dict(cfg.gym_kwargs)
        first = self._make(env_id, cfg, kwargs)
        act = first.action_space
        if not isinstance(act, spaces.Box):
            first.close()
            raise ValueError(f"gym env {env_id!r} has a {type(act).__name__} action space; rlfleet needs a Box")
        obs_space = first.observation_space
        leaves = _leaves(obs_space) if isinstance(obs_space, spaces.Dict) else []
        self._image_key = _image_key(leaves)
        if isinstance(obs_space, spaces.Dict):
            self._state_keys = [k for k, _ in leaves if k != self._image_key]
            state_dim = sum(int(np.prod(sub.shape)) for k, sub in leaves if k != self._image_key)
        elif isinstance(obs_space, spaces.Box):
            self._state_keys = []
            state_dim = int(np.prod(obs_space.shape))
        else:
            first.close()
            raise ValueError(
                f"gym env {env_id!r} has a {type(obs_space).__name__} observation space; rlfleet maps Box and Dict"
            )
        self._init_core(cfg, num_envs, env_offset, state_dim, int(np.prod(act.shape)), [task_name(env_id)])
        self._action_shape = act.shape
        low, high = act.low.reshape(-1).astype(np.float64), act.high.reshape(-1).astype(np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        # a = low + (u + 1) / 2 * (high - low) where bounded; u itself elsewhere
        self._scale = np.where(finite, (high - low) / 2.0, 1.0)
        self._shift = np.where(finite, (high + low) / 2.0, 0.0)
        self._action_dtype = act.dtype
        self._success_keys = [cfg.success_key] if cfg.success_key else ["is_success", "success"]
        # Keys seen in `info` until the first episodes end: a success key that never appears is
        # warned about once (by the batch holding global env 0, so once per fleet), naming the others.
        self._info_keys: set[str] | None = set() if env_offset == 0 else None
        self._episodes_ended = 0
        self._envs = [first] + [self._make(env_id, cfg, kwargs) for _ in range(num_envs - 1)]
        self._last: list[Any] = [None] * num_envs
        self._seeded = [False] * num_envs

    @staticmethod
    def _make(env_id: str, cfg: EnvConfig, kwargs: dict[str, Any]) -> Any:
        env = _make(env_id, cfg.image_size, kwargs)
        if cfg.image_size and cfg.gym_render_quality == "fast":
            fast_rendering(env)
        return env

    def policy_actions(self, actions: np.ndarray) -> np.ndarray:
        """Actions in the env's own units (a LeRobot dataset's) as the policy's [-1, 1]: the
        inverse of the rescaling `step_one` applies."""
        a = np.asarray(actions, np.float64).reshape(len(actions), -1)
        return ((a - self._shift) / self._scale).astype(np.float32)

    # --- EpisodeEnv hooks ------------------------------------------------------------------------

    def reset_one(self, i: int, seed: int | None) -> None:
        if seed is None and not self._seeded[i]:
            seed = int(np.random.SeedSequence([self._cfg.seed, self._env_offset + i]).generate_state(1)[0])
        self._last[i], _ = self._envs[i].reset(seed=seed)
        self._seeded[i] = True

    def step_one(self, i: int, action: np.ndarray) -> Outcome:
        a = (action * self._scale + self._shift).astype(self._action_dtype).reshape(self._action_shape)
        obs, reward, terminated, truncated, info = self._envs[i].step(a)
        self._last[i] = obs
        if self._info_keys is not None:
            self._info_keys.update(str(k) for k in info)
        success = next((bool(info[k]) for k in self._success_keys if k in info), False)
        return Outcome(float(reward), success, bool(terminated), bool(truncated))

    def episode_finished(self, i: int) -> None:
        self._episodes_ended += 1
        if self._info_keys is None or self._episodes_ended < SUCCESS_KEY_EPISODES:
            return
        seen, self._info_keys = self._info_keys, None  # checked once
        if any(k in seen for k in self._success_keys):
            return
        found = ", ".join(sorted(seen)) or "none"
        if self._cfg.success_key:
            log.warning(
                "env.success_key=%r never appeared in info in the first %d episodes, so success reads 0%%; "
                "info keys seen: %s",
                self._cfg.success_key,
                self._episodes_ended,
                found,
            )
        elif seen:
            log.warning(
                "no 'is_success' or 'success' in info in the first %d episodes, so success reads 0%%; "
                "set env.success_key to one of the info keys seen: %s",
                self._episodes_ended,
                found,
            )

    def state_one(self, i: int) -> np.ndarray:
        obs = self._last[i]
        if not self._state_keys:
            return np.asarray(obs, np.float32).reshape(-1)
        return np.concatenate([np.asarray(_get(obs, k), np.float32).reshape(-1) for k in self._state_keys])

    def render_one(self, i: int) -> np.ndarray:
        if self._image_key is not None:
            frame = _get(self._last[i], self._image_key)
        else:
            frame = self._envs[i].render()
        return _resize(np.asarray(frame, np.uint8), self._cfg.image_size)

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []
        self._started = False
