"""MetaWorld (v3 tasks, state observations) as a `ChunkedEnv`.

Why not `gym.make("Meta-World/MT1", ...)`: that builds 6 wrapper layers and, per env, pre-computes
50 goals with 50 full resets (~1.5 s per env), and its goals come from the global numpy RNG unless
seeded. Here each env is the raw task class set up exactly as MT1's `set_task` leaves it (goal
visible in the observation, v2 reward), we keep the time limit and episode stats ourselves, and
every episode draws a fresh goal/object layout from the task's own random-reset space with a
per-episode seeded generator (MetaWorld's `seeded_rand_vec` path). MT1 draws its 50 fixed goals
per task from that same distribution; we are not limited to 50, episodes are exactly reproducible
from `reset(seeds)`, and the global numpy RNG is never touched.

Speed (a step is ~0.2 ms of mujoco and ~0.6 ms of MetaWorld Python): two hot spots are replaced
by exact equivalents (`rlfleet.envs.metaworld.speed`), together ~+35% env steps/s on reach-v3 and MT10.

Files by job: `tasks` (task sets, instructions, difficulty), `speed` (the patches), `render`
(camera frames), this module (the env: hooks of `rlfleet.envs.core.EpisodeEnv`).
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.core import EpisodeEnv, Outcome, episode_rng
from rlfleet.envs.metaworld.config import MetaWorldEnvConfig
from rlfleet.envs.metaworld.render import CameraRenderer
from rlfleet.envs.metaworld.speed import _quat_from_matrix, install_fast_rotation  # noqa: F401
from rlfleet.envs.metaworld.speed import touching_object as _touching_object
from rlfleet.envs.metaworld.tasks import (  # noqa: F401  (re-exported: callers import the tables from here)
    ALL_TASKS,
    DIFFICULTY,
    FINGERTIP_GOAL_TASKS,
    TASK_DESCRIPTIONS,
    TASK_SETS,
    _env_dict,
    resolve_tasks,
)
from rlfleet.envs.metaworld.tasks import task_groups as _task_groups

STATE_DIM = 39
ACTION_DIM = 4
HAND, GOAL = slice(0, 3), slice(36, 39)  # in the 39-dim state


@contextmanager
def _quiet_gym() -> Iterator[None]:
    """MetaWorld's observation-space bounds trip gymnasium's space warnings; they are noise here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*observation space.*")
        warnings.filterwarnings("ignore", message=r".*Box .*precision.*")
        yield


def _make_raw_env(task: str, max_episode_steps: int) -> Any:
    """The bare MetaWorld task env, configured as MT1's `set_task` would, but goal-randomised per reset."""
    env = _env_dict.ALL_V3_ENVIRONMENTS[task]()  # reward_function_version="v2", as MT1 uses
    env._set_task_called = True
    env._partially_observable = False  # MT benchmarks show the goal in obs[36:39]
    env.__dict__.pop("sawyer_observation_space", None)  # cached_property depends on the flag above
    env._freeze_rand_vec = False  # sample a new goal/object layout on every reset ...
    env.seeded_rand_vec = True  # ... from env.np_random, which we seed per episode
    env.max_path_length = max_episode_steps  # MetaWorld then raises if we ever forget to reset
    env._pad_geom_ids = (env.data.geom("leftpad_geom").id, env.data.geom("rightpad_geom").id)
    env.touching_object = types.MethodType(_touching_object, env)  # this instance only
    return env


class MetaWorldEnv(EpisodeEnv):
    """A batch of MetaWorld task envs stepped in-process, one chunk of K actions at a time.

    Env i (global index `env_offset + i`) runs task `task_list[(env_offset + i) % len(task_list)]`
    and its episodes are seeded from its own generator, so workers holding different slices of
    one large batch get distinct tasks and seeds. With `seeds=None` the first reset seeds env i
    from (cfg.seed, env_offset + i); later resets continue each env's generator. MetaWorld tasks
    never end by themselves: episodes end by truncation, or on success with terminate_on_success.
    """

    CONFIG_CLASS = MetaWorldEnvConfig
    _cfg: MetaWorldEnvConfig
    task_groups = staticmethod(_task_groups)  # difficulty split and ML45 held-out, for reports
    GRIPPER_ACTION_DIMS = (3,)  # dx, dy, dz (mocap deltas), gripper effort
    # 1: the first frame of an episode shows its own goal (reset_one); the reach experts aim the
    # fingertips at the goal (expert_one)
    DEMOS_REVISION = 1

    @classmethod
    def config_tasks(cls, cfg: EnvConfig) -> list[str]:
        return resolve_tasks(cfg.task)

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        cfg = MetaWorldEnvConfig.of(cfg)
        self._init_core(cfg, num_envs, env_offset, STATE_DIM, ACTION_DIM, resolve_tasks(cfg.task))
        install_fast_rotation()
        with _quiet_gym():
            self._envs = [_make_raw_env(t, cfg.max_episode_steps) for t in self._env_tasks]
        self._renderers = (
            [CameraRenderer(e, cfg.image_size, cfg.camera, cfg.goal_marker_size) for e in self._envs]
            if cfg.image_size
            else []
        )
        import mujoco  # after MUJOCO_GL is set (the metaworld package __init__, imported above)

        self._mj_forward = mujoco.mj_forward
        self._rngs: list[np.random.Generator | None] = [None] * num_envs  # per-env episode-seed generators
        self._experts: list[Any] | None = None  # scripted experts, built on first use (demos, DAgger)
        self._raw = [np.zeros(STATE_DIM)] * num_envs  # each env's last observation

    # --- EpisodeEnv hooks ------------------------------------------------------------------------

    def reset_one(self, i: int, seed: int | None) -> None:
        rng = episode_rng(self._rngs, i, seed, self._cfg.seed, self._env_offset + i)
        env = self._envs[i]
        env.np_random = np.random.default_rng(int(rng.integers(2**63)))
        with _quiet_gym():
            self._raw[i], _ = env.reset()
        # Tasks move their goal site in the model after their last forward pass, so without this
        # the first frame draws the previous episode's goal (reach-v3, plate-slide-v3); the state
        # and the dynamics are unchanged (forward does not advance time).
        self._mj_forward(env.model, env.data)

    def step_one(self, i: int, action: np.ndarray) -> Outcome:
        obs, reward, _, _, info = self._envs[i].step(action)
        self._raw[i] = obs
        return Outcome(reward, bool(info["success"]))

    def state_one(self, i: int) -> np.ndarray:
        return self._raw[i]

    def render_one(self, i: int) -> np.ndarray:
        return self._renderers[i].render()

    def instruction_one(self, i: int) -> str:
        return TASK_DESCRIPTIONS[self._env_tasks[i]]

    def expert_one(self, i: int) -> np.ndarray:
        """MetaWorld's scripted expert (`metaworld.policies.ENV_POLICY_MAP[task]`, stateless) on the
        same 39-dim observation as `obs["states"]` (float32, cast to float64), clipped, as
        `rlfleet.runs.collect` records demos."""
        if self._experts is None:
            from metaworld.policies import ENV_POLICY_MAP  # after MUJOCO_GL is set (package __init__)

            missing = sorted({t for t in self._env_tasks if t not in ENV_POLICY_MAP})
            if missing:
                raise ValueError(f"MetaWorld has no scripted expert for {missing}")
            self._experts = [ENV_POLICY_MAP[t]() for t in self._env_tasks]
        state = np.asarray(self._raw[i], np.float32).astype(np.float64)
        if self._env_tasks[i] in FINGERTIP_GOAL_TASKS:  # aim the fingertips, not the hand, at the goal
            env = self._envs[i]
            state[GOAL] += state[HAND] - env.tcp_center
        with warnings.catch_warnings():  # the experts warn whenever an action exceeds [-1, 1]; we clip
            warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
            action = self._experts[i].get_action(state)
        return np.clip(np.asarray(action, np.float32), -1.0, 1.0)

    def close(self) -> None:
        for renderer in self._renderers:
            renderer.close()
        self._renderers = []
        for env in self._envs:
            env.close()
        self._envs = []
        self._started = False
