"""RoboTwin-style dual-arm tasks on SAPIEN as a `ChunkedEnv` (one SAPIEN scene per env, in-process).

Config string (`EnvConfig.task`): comma-separated items `task[:setting][:split]`, or `all[...]` for
all ten tasks. setting: `clean` (default) or `randomized`; split: `train` (default), `eval`,
`validation` or `any`. `task_list` holds the items as written (with `all` expanded), so `place_empty_cup` and
`place_empty_cup:randomized` are different tasks to `obs["task_ids"]`. With `RoboTwinEnvConfig.pool`
"validation" (`rlfleet eval --split validation`, `eval.split=validation`) every item plays its
validation seed file instead, under the same item name.

Seeds. With split `train`/`eval`, episode seeds come from the shipped seed files (solvable by the
scripted expert; train and eval disjoint) and every seed passed to `reset(seeds)` is an *index*
into that list (wrapping around) after division by the number of task items n: with one item an
evaluator's seeds 0..N-1 mean the first N eval episodes; with n items `evaluate_policy`'s seeds
base + j*n + i give item i its entries j = 0..N-1, all distinct up to the list length.
Split `any` uses seeds as given (unfiltered), except the task's shipped eval and validation seeds: those play
seed + `HELD_OUT_SHIFT` (2**40), so no training env or demo replays a held-out layout (demo
collection's seeds start at 1_000_000, where the eval seeds do). Without explicit seeds, env i of a batch with
`env_offset` o (global index g = o + i) plays list entries g + cfg.seed, g + cfg.seed + T,
g + cfg.seed + 2T, ... where T = `num_total_envs` (default o + num_envs: correct for one process;
workers of a multi-process batch should pass the batch total so their seeds never overlap).

Observation `states` (43 float32): per arm (left, right) 7 joint angles, gripper opening (m) and
end-effector xyz relative to the table top (22), then up to three task objects (see
`Task.key_objects`) as xyz relative to the table top + wxyz quaternion (21; zero where a task has
fewer). Action (8, in [-1, 1]): per arm (left, right) end-effector dx, dy, dz (times 2.5 cm, fixed
top-down orientation, solved by IK) and gripper (+1 close, -1 open). One env step is 1/25 s.
"""

from __future__ import annotations

import numpy as np

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.core import EpisodeEnv, Outcome
from rlfleet.envs.robotwin.config import RoboTwinEnvConfig
from rlfleet.envs.robotwin.experts import ScriptedExpert
from rlfleet.envs.robotwin.scene import ARMS, DualArmScene, require_renderer
from rlfleet.envs.robotwin.seeds import HELD_OUT_SHIFT, SPLITS, check_splits_disjoint, held_out_seeds, load_seeds
from rlfleet.envs.robotwin.settings import SETTINGS, Clutter
from rlfleet.envs.robotwin.tasks import TASKS, Task

ACTION_DIM = 8
PROPRIO_DIM = 22
MAX_OBJECTS = 3
STATE_DIM = PROPRIO_DIM + 7 * MAX_OBJECTS


def parse_task(item: str) -> tuple[str, str, str]:
    """`"place_empty_cup:randomized:eval"` -> (task, setting, split), defaults clean and train."""
    name, *opts = [p.strip() for p in item.split(":")]
    setting, split = "clean", "train"
    for opt in opts:
        if opt in SETTINGS:
            setting = opt
        elif opt in SPLITS:
            split = opt
        else:
            raise ValueError(f"unknown option {opt!r} in {item!r}; settings {list(SETTINGS)}, splits {list(SPLITS)}")
    if name not in TASKS:
        raise ValueError(f"unknown RoboTwin task {name!r}; tasks: {', '.join(TASKS)} (or 'all')")
    return name, setting, split


def resolve_tasks(task: str) -> list[str]:
    """Expand `EnvConfig.task` into the env's task list (items validated, `all` expanded)."""
    out: list[str] = []
    for item in (t.strip() for t in task.split(",")):
        if not item:
            continue
        head, _, rest = item.partition(":")
        names = list(TASKS) if head == "all" else [head]
        for name in names:
            full = f"{name}:{rest}" if rest else name
            parse_task(full)
            out.append(full)
    if not out:
        raise ValueError(f"no RoboTwin task in {task!r}")
    return out


class _Slot:
    """One env: its scene, task, clutter, expert and seed cursor."""

    def __init__(self, item: str, image_size: int, allow_held_out: bool = False, pool: str = "train") -> None:
        self.task_name, setting, self.split = parse_task(item)
        if pool == "validation":  # the validation split: every item plays its validation seed file
            self.split = "validation"
        self.scene = DualArmScene(image_size)
        self.task: Task = TASKS[self.task_name](self.scene)
        self.clutter = Clutter(self.scene, SETTINGS[setting])
        self.seeds = load_seeds(self.task_name, self.split, setting) if self.split != "any" else None
        any_raw = self.split == "any" and not allow_held_out
        self.held_out = held_out_seeds(self.task_name, setting) if any_raw else frozenset()
        self.expert = ScriptedExpert(self.task)
        self.cursor: int | None = None  # seed cursor, set by the first reset
        self.progress = 0.0  # the task's progress after the last step (progress_reward)

    def episode_seed(self, index: int) -> int:
        if self.seeds is not None:
            return int(self.seeds[index % len(self.seeds)])
        return int(index) + HELD_OUT_SHIFT if index in self.held_out else int(index)

    def reset(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.scene.set_table_height(self.clutter.table_height(rng))
        self.task.reset(rng)
        self.clutter.layout(self.task, rng)
        self.scene.home_arms(dict.fromkeys(ARMS, self.task.grip_yaw))
        for _ in range(2):  # let objects settle on the table
            self.scene.scene.step()
        self.expert.reset()
        self.progress = self.task.progress() or 0.0

    def state(self) -> np.ndarray:
        out = np.zeros(STATE_DIM, np.float32)
        out[:PROPRIO_DIM] = self.scene.proprio()
        for j, obj in enumerate(self.task.key_objects()[:MAX_OBJECTS]):
            k = PROPRIO_DIM + 7 * j
            out[k : k + 3] = self.task.rel(obj)
            out[k + 3 : k + 7] = obj.pose.q
        return out

    def dense_reward(self, success: bool) -> float:
        """1 on success, plus up to 0.1 for a hand near the first task object (cheap reach shaping)."""
        target = np.asarray(self.task.key_objects()[0].pose.p)
        d = min(np.linalg.norm(arm.ee_pos() - target) for arm in self.scene.arms.values())
        return float(success) + 0.1 * (1.0 - np.tanh(5.0 * d))


class RoboTwinEnv(EpisodeEnv):
    """A batch of dual-arm SAPIEN scenes; env i runs `task_list[(env_offset + i) % len(task_list)]`.

    Episodes end by truncation, or on success with terminate_on_success.
    """

    GRIPPER_ACTION_DIMS = (3, 7)  # per arm dx, dy, dz (end-effector target deltas), gripper
    CONFIG_CLASS = RoboTwinEnvConfig
    _cfg: RoboTwinEnvConfig

    def __init__(
        self,
        cfg: EnvConfig,
        num_envs: int,
        env_offset: int = 0,
        num_total_envs: int | None = None,
        allow_held_out: bool = False,
    ) -> None:
        """`allow_held_out`: split `any` plays the eval seeds too (only for the eval seed search)."""
        cfg = RoboTwinEnvConfig.of(cfg)
        self._init_core(cfg, num_envs, env_offset, STATE_DIM, ACTION_DIM, resolve_tasks(cfg.task))
        if cfg.image_size > 0:
            require_renderer()
        if cfg.progress_reward and cfg.reward_type == "success_once":
            raise ValueError(
                "progress_reward needs reward_type 'success' or 'dense' (success_once pays 0/1 per episode)"
            )
        num_total_envs = num_total_envs or cfg.fleet_envs or None  # the fleet's envs, when actors say
        self._stride = num_total_envs if num_total_envs is not None else env_offset + num_envs
        if self._stride < env_offset + num_envs:
            raise ValueError(f"num_total_envs {num_total_envs} < env_offset + num_envs = {env_offset + num_envs}")
        self._slots = [_Slot(item, cfg.image_size, allow_held_out, cfg.pool) for item in self._env_tasks]

    @classmethod
    def check_held_out_splits(cls, cfg: EnvConfig, test_seeds: range, validation_seeds: range) -> None:
        """Each item's shipped train, eval (test) and validation seed files share no layout."""
        for item in resolve_tasks(cfg.task):
            task, setting, _ = parse_task(item)
            check_splits_disjoint(task, setting)

    @property
    def episode_seeds(self) -> list[int]:
        """The raw scene seed each env's current episode was built from (for logs and replays)."""
        return [s.episode_seed(self._list_index(s)) for s in self._slots]

    def episode_scenes(self) -> list[int]:
        """The raw scene seeds: a seed-list entry is the same scene whatever seed or layout led to it."""
        return self.episode_seeds

    def _list_index(self, slot: _Slot) -> int:
        """Seed-list entry of a slot's cursor: cursor // (number of task items), because envs (and
        the evaluator's seeds base + j * n + i) cycle over the n items, so each item walks its own
        list entry by entry instead of every n-th one. Split `any` takes the cursor as the seed."""
        cursor = slot.cursor or 0
        return cursor // len(self._task_list) if slot.seeds is not None else cursor

    # --- EpisodeEnv hooks ------------------------------------------------------------------------

    def reset_one(self, i: int, seed: int | None) -> None:
        """`seed` indexes the split's seed list (see module docstring); without one, env i starts at
        cfg.seed + its global index and then strides by the fleet's env count."""
        slot = self._slots[i]
        if seed is not None:
            slot.cursor = seed
        elif slot.cursor is None:
            slot.cursor = self._cfg.seed + self._env_offset + i
        else:
            slot.cursor += self._stride
        slot.reset(slot.episode_seed(self._list_index(slot)))

    def step_one(self, i: int, action: np.ndarray) -> Outcome:
        slot = self._slots[i]
        slot.scene.apply_action(action)
        ok = slot.task.success()
        dense = slot.dense_reward(ok) if self._cfg.reward_type == "dense" else 0.0
        if not self._cfg.progress_reward:
            return Outcome(dense, ok)
        before, slot.progress = slot.progress, slot.task.progress() or 0.0
        shaping = self._cfg.progress_reward * (slot.progress - before)
        return Outcome(dense + shaping, ok, sparse_reward=float(ok) + shaping)

    def state_one(self, i: int) -> np.ndarray:
        return self._slots[i].state()

    def render_one(self, i: int) -> np.ndarray:
        return self._slots[i].scene.render()

    def instruction_one(self, i: int) -> str:
        return self._slots[i].task.instruction

    def expert_one(self, i: int) -> np.ndarray:
        return self._slots[i].expert.act(int(self._ep_length[i]))

    def close(self) -> None:
        self._slots = []
        self._started = False
