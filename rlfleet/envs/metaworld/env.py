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
by exact equivalents, together ~+35% env steps/s on reach-v3 and MT10.
* Object quaternions come from `scipy...Rotation.from_matrix(m).as_quat()`, ~140 us a call.
  `_install_fast_rotation` swaps in a scalar version of scipy's algorithm: bit-identical for valid
  rotation matrices, and it defers to scipy for anything else.
* `touching_object` (grasp tasks) loops over every mujoco contact in Python, ~0.5 ms a call; each
  of our env instances gets a vectorised `_touching_object` with the same rule.
"""

from __future__ import annotations

import math
import os
import sys
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from rlfleet.envs.api import ChunkedEnv, EnvConfig, EnvSpec, StepResult, batch_observation, check_seeds, encode_instructions

# Offscreen rendering without a display: EGL works on CPU through Mesa's llvmpipe (FACTS.md).
os.environ.setdefault("MUJOCO_GL", "egl")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import metaworld  # noqa: F401  (registers Meta-World/* gym ids; imports every task module)
    import metaworld.env_dict as _env_dict
    from scipy.spatial.transform import Rotation as _ScipyRotation

STATE_DIM = 39
ACTION_DIM = 4

TASK_SETS: dict[str, list[str]] = {
    "MT10": list(_env_dict.MT10_V3),
    "MT25": list(_env_dict.MT25_V3),
    "MT50": list(_env_dict.MT50_V3),
    # ML45: train on 45 tasks, evaluate on the 5 held out (as MetaWorld's own split)
    "ML45_train": list(_env_dict.ML45_V3["train"]),
    "ML45_test": list(_env_dict.ML45_V3["test"]),
}
ALL_TASKS: list[str] = list(_env_dict.ALL_V3_ENVIRONMENTS)

TASK_DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "pick up the nut and place it onto the peg",
    "basketball-v3": "pick up the basketball and dunk it into the basket",
    "bin-picking-v3": "pick up the puck from one bin and place it into the other bin",
    "box-close-v3": "pick up the box lid and close the box with it",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "bypass the wall and press the button from the top",
    "button-press-v3": "press the button",
    "button-press-wall-v3": "bypass the wall and press the button",
    "coffee-button-v3": "push the button on the coffee machine",
    "coffee-pull-v3": "pull the mug out from under the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "rotate the dial 180 degrees",
    "disassemble-v3": "pick the nut off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door by rotating the lock clockwise",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door by rotating the lock counter-clockwise",
    "hand-insert-v3": "insert the gripper into the hole",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-open-v3": "rotate the faucet handle counter-clockwise",
    "faucet-close-v3": "rotate the faucet handle clockwise",
    "hammer-v3": "pick up the hammer and hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down sideways",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up sideways",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up 90 degrees",
    "pick-place-wall-v3": "pick up the puck, bypass the wall and place it at the goal",
    "pick-out-of-hole-v3": "pick the puck up out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the cabinet",
    "plate-slide-side-v3": "slide the plate into the cabinet sideways",
    "plate-slide-back-v3": "slide the plate out of the cabinet",
    "plate-slide-back-side-v3": "slide the plate out of the cabinet sideways",
    "peg-insert-side-v3": "pick up the peg and insert it sideways into the hole",
    "peg-unplug-side-v3": "unplug the peg sideways",
    "soccer-v3": "push the soccer ball into the goal",
    "stick-push-v3": "pick up the stick and push the box with it",
    "stick-pull-v3": "pick up the stick and pull the box with it",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "bypass the wall and push the puck to the goal",
    "push-back-v3": "push the puck back to the goal",
    "reach-v3": "reach the goal position",
    "reach-wall-v3": "bypass the wall and reach the goal position",
    "shelf-place-v3": "pick up the puck and place it onto the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "push the window open",
    "window-close-v3": "push the window closed",
}

# The easy / medium / hard / very_hard split of Seo et al. (2022), as in RLinf's metaworld_config.json.
_DIFFICULTY_TO_TASKS: dict[str, list[str]] = {
    "easy": [
        "button-press-v3", "button-press-topdown-v3", "button-press-topdown-wall-v3",
        "button-press-wall-v3", "coffee-button-v3", "dial-turn-v3", "door-close-v3",
        "door-lock-v3", "door-open-v3", "door-unlock-v3", "drawer-close-v3", "drawer-open-v3",
        "faucet-close-v3", "faucet-open-v3", "handle-press-v3", "handle-press-side-v3",
        "handle-pull-v3", "handle-pull-side-v3", "lever-pull-v3", "plate-slide-v3",
        "plate-slide-back-v3", "plate-slide-back-side-v3", "plate-slide-side-v3", "reach-v3",
        "reach-wall-v3", "window-close-v3", "window-open-v3", "peg-unplug-side-v3",
    ],
    "medium": [
        "basketball-v3", "bin-picking-v3", "box-close-v3", "coffee-pull-v3", "coffee-push-v3",
        "hammer-v3", "peg-insert-side-v3", "push-wall-v3", "soccer-v3", "sweep-v3", "sweep-into-v3",
    ],
    "hard": [
        "assembly-v3", "hand-insert-v3", "pick-out-of-hole-v3", "pick-place-v3", "push-v3", "push-back-v3",
    ],
    "very_hard": [
        "shelf-place-v3", "disassemble-v3", "stick-pull-v3", "stick-push-v3", "pick-place-wall-v3",
    ],
}  # fmt: skip
DIFFICULTY: dict[str, str] = {t: level for level, tasks in _DIFFICULTY_TO_TASKS.items() for t in tasks}

# The third entropy word of a training env's episode stream. An integer reset seed s (evaluation,
# demos, GRPO groups; all < 2**64) is numpy entropy [s] == [s, 0, 0] or [lo, hi] == [lo, hi, 0]:
# with this word != 0 no training stream can equal an evaluation episode's, whatever env.seed is.
TRAIN_STREAM = 1


def resolve_tasks(task: str) -> list[str]:
    """Expand `EnvConfig.task` (a task, MT10/MT25/MT50, or "a-v3,b-v3") into the env's task list.

    `obs["task_ids"]` index into this list; it depends only on the string, so every worker
    process of a run agrees on it.
    """
    if task in TASK_SETS:
        return list(TASK_SETS[task])
    names = [t.strip() for t in task.split(",") if t.strip()]
    unknown = [t for t in names if t not in _env_dict.ALL_V3_ENVIRONMENTS]
    if not names or unknown:
        raise ValueError(
            f"unknown MetaWorld task(s) {unknown or [task]}; use a task set ({', '.join(TASK_SETS)}), "
            f"a comma-separated list, or any of: {', '.join(sorted(ALL_TASKS))}"
        )
    return names


# --- fast quaternions -------------------------------------------------------------------------


def _quat_from_matrix(matrix: Any) -> np.ndarray | None:
    """scipy's `Rotation.from_matrix(m).as_quat()` (x, y, z, w) for one valid rotation matrix.

    Same checks (det > 0, M M^T == I within atol 1e-12 / rtol 1e-5) and same Markley branch
    arithmetic as scipy, so results are bit-identical; returns None when scipy would need to
    orthogonalise or raise, so the caller can defer to scipy.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (3, 3):
        return None
    (m00, m01, m02), (m10, m11, m12), (m20, m21, m22) = m.tolist()
    det = m00 * (m11 * m22 - m12 * m21) - m01 * (m10 * m22 - m12 * m20) + m02 * (m10 * m21 - m11 * m20)
    if not det > 0.0:
        return None
    diag_tol = 1e-12 + 1e-5
    if (
        abs(m00 * m00 + m01 * m01 + m02 * m02 - 1.0) > diag_tol
        or abs(m10 * m10 + m11 * m11 + m12 * m12 - 1.0) > diag_tol
        or abs(m20 * m20 + m21 * m21 + m22 * m22 - 1.0) > diag_tol
        or abs(m00 * m10 + m01 * m11 + m02 * m12) > 1e-12
        or abs(m00 * m20 + m01 * m21 + m02 * m22) > 1e-12
        or abs(m10 * m20 + m11 * m21 + m12 * m22) > 1e-12
    ):
        return None
    trace = m00 + m11 + m22
    # argmax over (m00, m11, m22, trace), first index wins ties, as np.argmax does.
    choice, best = 0, m00
    if m11 > best:
        choice, best = 1, m11
    if m22 > best:
        choice, best = 2, m22
    if trace > best:
        choice = 3
    if choice == 0:
        q = (1 - trace + 2 * m00, m10 + m01, m20 + m02, m21 - m12)
    elif choice == 1:
        q = (m01 + m10, 1 - trace + 2 * m11, m21 + m12, m02 - m20)
    elif choice == 2:
        q = (m02 + m20, m12 + m21, 1 - trace + 2 * m22, m10 - m01)
    else:
        q = (m21 - m12, m02 - m20, m10 - m01, 1 + trace)
    norm = math.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    return np.array([q[0] / norm, q[1] / norm, q[2] / norm, q[3] / norm])


class _QuatOnly:
    """Result of the fast `from_matrix`: `as_quat()` is free; anything else goes through scipy."""

    __slots__ = ("_quat",)

    def __init__(self, quat: np.ndarray) -> None:
        self._quat = quat

    def as_quat(self, canonical: bool = False, *, scalar_first: bool = False) -> np.ndarray:
        if canonical or scalar_first:
            return _ScipyRotation.from_quat(self._quat).as_quat(canonical=canonical, scalar_first=scalar_first)
        return self._quat.copy()

    def __getattr__(self, name: str) -> Any:
        return getattr(_ScipyRotation.from_quat(self._quat), name)


class _FastRotation(_ScipyRotation):
    """scipy `Rotation` whose `from_matrix` skips scipy's per-call overhead for single matrices."""

    @staticmethod
    def from_matrix(matrix: Any, *, assume_valid: bool = False) -> Any:  # type: ignore[override]
        quat = _quat_from_matrix(matrix)
        if quat is None:
            return _ScipyRotation.from_matrix(matrix, assume_valid=assume_valid)
        return _QuatOnly(quat)


def _install_fast_rotation() -> None:
    """Point every MetaWorld module's `Rotation` at `_FastRotation` (idempotent)."""
    for name, module in list(sys.modules.items()):
        if name.startswith("metaworld") and getattr(module, "Rotation", None) is _ScipyRotation:
            module.Rotation = _FastRotation  # type: ignore[attr-defined]


def _touching_object(env: Any, object_geom_id: int) -> bool:
    """`SawyerXYZEnv.touching_object` without a Python loop over every contact (~0.5 ms per call there).

    Same rule: both finger pads have contacts with the object whose summed constraint force is > 0.
    """
    contact = env.data.contact
    if len(contact) == 0:
        return False
    geom1, geom2 = contact.geom1, contact.geom2
    with_object = (geom1 == object_geom_id) | (geom2 == object_geom_id)
    force = env.data.efc_force
    for pad in env._pad_geom_ids:
        rows = with_object & ((geom1 == pad) | (geom2 == pad))
        if not float(np.sum(force[contact.efc_address[rows]])) > 0:
            return False
    return True


# --- rendering --------------------------------------------------------------------------------


class CameraRenderer:
    """`main_images` for one env: mujoco offscreen rendering with the CPU-friendly settings of FACTS.md.

    Multisampling, shadows and reflections cost most of a llvmpipe frame and add nothing a small
    policy can use (the unused 4096^2 shadow map alone is ~65 MB per renderer); MetaWorld's `corner` cameras come out rotated 180 degrees, so frames are flipped.
    """

    def __init__(self, env: Any, size: int, camera: str) -> None:
        import mujoco

        model = env.model
        try:
            self._camera = model.camera(camera).id
        except KeyError as exc:
            names = [model.camera(i).name for i in range(model.ncam)]
            raise ValueError(f"unknown camera {camera!r}; this task has {names}") from exc
        model.vis.quality.offsamples = 0
        model.vis.quality.shadowsize = 0
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, size)
        model.vis.global_.offheight = max(model.vis.global_.offheight, size)
        self._renderer = mujoco.Renderer(model, size, size)
        self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._flip = camera.startswith("corner")
        self._env = env

    def render(self) -> np.ndarray:
        self._renderer.update_scene(self._env.data, camera=self._camera)
        img = self._renderer.render()
        return img[::-1, ::-1] if self._flip else img

    def close(self) -> None:
        self._renderer.close()


# --- the env ----------------------------------------------------------------------------------


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


class MetaWorldEnv(ChunkedEnv):
    """A batch of MetaWorld task envs stepped in-process, one chunk of K actions at a time.

    Env i (global index `env_offset + i`) runs task `task_list[(env_offset + i) % len(task_list)]`
    and its episodes are seeded from its own generator, so workers holding different slices of
    one large batch get distinct tasks and seeds.
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if env_offset < 0:
            raise ValueError(f"env_offset must be >= 0, got {env_offset}")
        if cfg.chunk_size < 1 or cfg.max_episode_steps < 1:
            raise ValueError(
                f"chunk_size and max_episode_steps must be >= 1, got {cfg.chunk_size}, {cfg.max_episode_steps}"
            )
        self._cfg = cfg
        self._num_envs = num_envs
        self._env_offset = env_offset
        self._task_list = resolve_tasks(cfg.task)
        n_tasks = len(self._task_list)
        task_idx = [(env_offset + i) % n_tasks for i in range(num_envs)]
        self._task_ids = np.asarray(task_idx, dtype=np.int64)
        self._env_tasks = [self._task_list[j] for j in task_idx]
        self._descriptions = [TASK_DESCRIPTIONS[t] for t in self._env_tasks]
        self._instructions = encode_instructions(self._descriptions)
        self._spec = EnvSpec(
            state_dim=STATE_DIM,
            action_dim=ACTION_DIM,
            chunk_size=cfg.chunk_size,
            num_envs=num_envs,
            max_episode_steps=cfg.max_episode_steps,
            task_names=list(self._env_tasks),
        )

        _install_fast_rotation()
        with _quiet_gym():
            self._envs = [_make_raw_env(t, cfg.max_episode_steps) for t in self._env_tasks]
        if cfg.reward_type not in ("dense", "success", "success_once"):
            raise ValueError(f"reward_type must be 'dense', 'success' or 'success_once', got {cfg.reward_type!r}")
        size = cfg.image_size
        if size < 0 or size > 1024:
            raise ValueError(f"image_size must be 0 (no images) or 1..1024, got {size}")
        self._renderers = [CameraRenderer(e, size, cfg.camera) for e in self._envs] if size else []
        self._images = np.zeros((num_envs, size, size, 3), np.uint8) if size else None

        self._rngs: list[np.random.Generator] | None = None  # per-env episode-seed generators
        self._experts: list[Any] | None = None  # scripted experts, built on first use (DAgger)
        self._states = np.zeros((num_envs, STATE_DIM), dtype=np.float32)
        self._ep_return = np.zeros(num_envs, dtype=np.float64)
        self._ep_length = np.zeros(num_envs, dtype=np.int32)
        self._ep_success = np.zeros(num_envs, dtype=bool)

    def reset(self, seeds: np.ndarray | None = None) -> dict:
        """Start a new episode everywhere; see `ChunkedEnv.reset`.

        With `seeds=None` the first call seeds env i from (cfg.seed, env_offset + i, TRAIN_STREAM); later calls
        continue each env's generator, so repeated resets do not replay the same episodes.
        """
        if seeds is not None:
            seeds = check_seeds(seeds, self._num_envs)
            self._rngs = [np.random.default_rng(int(s)) for s in seeds]
        elif self._rngs is None:
            self._rngs = [
                np.random.default_rng(np.random.SeedSequence([self._cfg.seed, self._env_offset + i, TRAIN_STREAM]))
                for i in range(self._num_envs)
            ]
        for i in range(self._num_envs):
            self._states[i] = self._reset_one(i)
            if self._images is not None:
                self._images[i] = self._renderers[i].render()
        return self._obs()

    def chunk_step(self, actions: np.ndarray) -> StepResult:
        """Run K substeps per env; see the module docstring of `rlfleet.envs.api` for auto-reset rules."""
        return self._chunk_step(actions)

    # --- MetaWorld's scripted experts (DAgger labels) ---------------------------------------------

    def expert_actions(self) -> np.ndarray:
        """The scripted expert's action at every env's current state, float32 [B, D] in [-1, 1].

        The expert (`metaworld.policies.ENV_POLICY_MAP[task]`, stateless) reads the same 39-dim
        observation as `obs["states"]` (float32, cast to float64) and its output is clipped, exactly
        as `rlfleet.data.demos.rollout_expert` records demos, so DAgger labels and demo actions are
        the same function of the observation.
        """
        return np.stack([self._expert_action(i, self._states[i]) for i in range(self._num_envs)])

    def expert_chunk_step(self, actions: np.ndarray, use_expert: np.ndarray) -> tuple[StepResult, np.ndarray, np.ndarray]:
        """`chunk_step` that also labels every visited state with the scripted expert's action.

        Env i executes, at each of its K substeps, the expert's action at the state it is in
        (queried on the fly) when `use_expert[i]`, else `actions[i, k]`. Returns the step result,
        `labels` [B, K, D] (labels[i, k] = expert action at the state before substep k: for an
        expert-executed chunk exactly the chunk it ran, for a student chunk what the expert would
        have done at each state the student visited) and the `executed` actions [B, K, D]. Substeps
        skipped after an episode ended are padded with the last label / executed action (as
        `rlfleet.data.sft.action_chunks` pads at episode ends).
        """
        use_expert = np.asarray(use_expert, dtype=bool)
        if use_expert.shape != (self._num_envs,):
            raise ValueError(f"use_expert must be {self._num_envs} bools, got shape {use_expert.shape}")
        labels = np.zeros((self._num_envs, self._cfg.chunk_size, ACTION_DIM), np.float32)
        executed = np.zeros_like(labels)
        result = self._chunk_step(actions, use_expert, labels, executed)
        return result, labels, executed

    def _expert_action(self, i: int, state: np.ndarray) -> np.ndarray:
        if self._experts is None:
            from metaworld.policies import ENV_POLICY_MAP  # after MUJOCO_GL is set (module top)

            missing = sorted({t for t in self._env_tasks if t not in ENV_POLICY_MAP})
            if missing:
                raise ValueError(f"MetaWorld has no scripted expert for {missing}")
            self._experts = [ENV_POLICY_MAP[t]() for t in self._env_tasks]
        with warnings.catch_warnings():  # the experts warn whenever an action exceeds [-1, 1]; we clip
            warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
            action = self._experts[i].get_action(np.asarray(state, np.float32).astype(np.float64))
        return np.clip(np.asarray(action, np.float32), -1.0, 1.0)

    def _chunk_step(self, actions: np.ndarray, use_expert: np.ndarray | None = None,
                    labels: np.ndarray | None = None, executed: np.ndarray | None = None) -> StepResult:
        if self._rngs is None:
            raise RuntimeError("call reset() before chunk_step()")
        B, K, D = self._num_envs, self._cfg.chunk_size, ACTION_DIM
        actions = np.asarray(actions)
        if actions.shape != (B, K, D):
            raise ValueError(
                f"actions must have shape (num_envs, chunk_size, action_dim) = ({B}, {K}, {D}), got {actions.shape}"
            )
        actions = np.clip(actions.astype(np.float32, copy=False), -1.0, 1.0)
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")

        max_steps = self._cfg.max_episode_steps
        dense = self._cfg.reward_type == "dense"
        rewards = np.zeros((B, K), dtype=np.float32)
        success = np.zeros(B, dtype=bool)
        truncated = np.zeros(B, dtype=bool)
        terminated = np.zeros(B, dtype=bool)
        ep_return = np.zeros(B, dtype=np.float32)
        ep_length = np.zeros(B, dtype=np.int32)
        ep_success = np.zeros(B, dtype=bool)
        final_obs = self._blank_obs()

        for i, env in enumerate(self._envs):
            state = self._states[i]  # float32, what the policy sees (the expert reads the same)
            for k in range(K):
                action = actions[i, k]
                if labels is not None:
                    labels[i, k] = self._expert_action(i, state)
                    if use_expert is not None and use_expert[i]:
                        action = labels[i, k]
                    executed[i, k] = action
                obs, reward, _, _, info = env.step(action)
                if labels is not None:
                    state = obs.astype(np.float32)
                if dense:
                    rewards[i, k] = reward
                elif self._cfg.reward_type == "success_once":  # the episode's return is success_once (0/1)
                    rewards[i, k] = float(info["success"] and not self._ep_success[i])
                else:
                    rewards[i, k] = float(info["success"])
                self._ep_return[i] += rewards[i, k]
                self._ep_length[i] += 1
                if info["success"]:
                    success[i] = True
                    self._ep_success[i] = True
                terminated[i] = bool(info["success"]) and self._cfg.terminate_on_success
                truncated[i] = self._ep_length[i] >= max_steps and not terminated[i]
                if terminated[i] or truncated[i]:
                    ep_return[i] = self._ep_return[i]
                    ep_length[i] = self._ep_length[i]
                    ep_success[i] = self._ep_success[i]
                    final_obs["states"][i] = obs
                    if self._images is not None:
                        final_obs["main_images"][i] = self._renderers[i].render()
                    obs = self._reset_one(i)
                    if labels is not None:  # skipped substeps: pad with the last label / action
                        labels[i, k + 1:] = labels[i, k]
                        executed[i, k + 1:] = executed[i, k]
                    break
            self._states[i] = obs
            if self._images is not None:
                self._images[i] = self._renderers[i].render()

        return StepResult(
            obs=self._obs(),
            rewards=rewards,
            terminated=terminated,  # only with terminate_on_success: MetaWorld tasks never end by themselves
            truncated=truncated,
            success=success,
            episode_done=terminated | truncated,
            episode_return=ep_return,
            episode_length=ep_length,
            episode_success_once=ep_success,
            final_obs=final_obs,
        )

    def close(self) -> None:
        for renderer in self._renderers:
            renderer.close()
        self._renderers = []
        for env in self._envs:
            env.close()
        self._envs = []
        self._rngs = None

    def _reset_one(self, i: int) -> np.ndarray:
        """New episode for env i with the next seed from its generator; returns the first state."""
        assert self._rngs is not None
        env = self._envs[i]
        env.np_random = np.random.default_rng(int(self._rngs[i].integers(2**63)))
        with _quiet_gym():
            obs, _ = env.reset()
        self._ep_return[i] = 0.0
        self._ep_length[i] = 0
        self._ep_success[i] = False
        return obs

    def _obs(self) -> dict:
        return batch_observation(self._states, self._instructions, self._task_ids, self._descriptions, self._images)

    def _blank_obs(self) -> dict:
        """Zeroed tensor observations, filled in only for envs whose episode ends (`final_obs`)."""
        B = self._num_envs
        obs = {"states": np.zeros((B, STATE_DIM), np.float32), "instructions": self._instructions.copy()}
        if self._images is not None:
            obs["main_images"] = np.zeros_like(self._images)
        return obs
