"""RoboTwin-style dual-arm tasks on SAPIEN as a `ChunkedEnv` (one SAPIEN scene per env, in-process).

Config string (`EnvConfig.task`): comma-separated items `task[:setting][:split]`, or `all[...]` for
all ten tasks. setting: `clean` (default) or `randomized`; split: `train` (default), `eval` or
`any`. `task_list` holds the items as written (with `all` expanded), so `place_empty_cup` and
`place_empty_cup:randomized` are different tasks to `obs["task_ids"]`.

Seeds. With split `train`/`eval`, episode seeds come from the shipped seed files (solvable by the
scripted expert; train and eval disjoint) and every seed passed to `reset(seeds)` is an *index*
into that list (wrapping around) after division by the number of task items n: with one item an
evaluator's seeds 0..N-1 mean the first N eval episodes; with n items `evaluate_policy`'s seeds
base + j*n + i give item i its entries j = 0..N-1, all distinct up to the list length.
Split `any` uses seeds as given (unfiltered). Without explicit seeds, env i of a batch with
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

from rlfleet.envs.api import (ChunkedEnv, EnvConfig, EnvSpec, StepResult, batch_observation, check_env_args, check_seeds,
                              encode_instructions)
from rlfleet.envs.robotwin.experts import ScriptedExpert
from rlfleet.envs.robotwin.scene import ARMS, DualArmScene, require_renderer
from rlfleet.envs.robotwin.seeds import SPLITS, load_seeds
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

    def __init__(self, item: str, image_size: int) -> None:
        self.task_name, setting, self.split = parse_task(item)
        self.scene = DualArmScene(image_size)
        self.task: Task = TASKS[self.task_name](self.scene)
        self.clutter = Clutter(self.scene, SETTINGS[setting])
        self.seeds = load_seeds(self.task_name, self.split, setting) if self.split != "any" else None
        self.expert = ScriptedExpert(self.task)
        self.cursor = 0

    def episode_seed(self, index: int) -> int:
        return int(self.seeds[index % len(self.seeds)]) if self.seeds is not None else int(index)

    def reset(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.scene.set_table_height(self.clutter.table_height(rng))
        self.task.reset(rng)
        self.clutter.layout(self.task, rng)
        self.scene.home_arms(dict.fromkeys(ARMS, self.task.grip_yaw))
        for _ in range(2):  # let objects settle on the table
            self.scene.scene.step()
        self.expert.reset()

    def state(self) -> np.ndarray:
        out = np.zeros(STATE_DIM, np.float32)
        out[:PROPRIO_DIM] = self.scene.proprio()
        for j, obj in enumerate(self.task.key_objects()[:MAX_OBJECTS]):
            k = PROPRIO_DIM + 7 * j
            out[k: k + 3] = self.task.rel(obj)
            out[k + 3: k + 7] = obj.pose.q
        return out

    def dense_reward(self, success: bool) -> float:
        """1 on success, plus up to 0.1 for a hand near the first task object (cheap reach shaping)."""
        target = np.asarray(self.task.key_objects()[0].pose.p)
        d = min(np.linalg.norm(arm.ee_pos() - target) for arm in self.scene.arms.values())
        return float(success) + 0.1 * (1.0 - np.tanh(5.0 * d))


class RoboTwinEnv(ChunkedEnv):
    """A batch of dual-arm SAPIEN scenes; env i runs `task_list[(env_offset + i) % len(task_list)]`."""

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0, num_total_envs: int | None = None) -> None:
        check_env_args(cfg, num_envs, env_offset)
        if cfg.image_size < 0 or cfg.image_size > 1024:
            raise ValueError(f"image_size must be 0 (no images) or 1..1024, got {cfg.image_size}")
        if cfg.image_size > 0:
            require_renderer()
        self._cfg = cfg
        self._num_envs = num_envs
        self._env_offset = env_offset
        self._stride = num_total_envs if num_total_envs is not None else env_offset + num_envs
        if self._stride < env_offset + num_envs:
            raise ValueError(f"num_total_envs {num_total_envs} < env_offset + num_envs = {env_offset + num_envs}")
        self._task_list = resolve_tasks(cfg.task)
        idx = [(env_offset + i) % len(self._task_list) for i in range(num_envs)]
        self._task_ids = np.asarray(idx, np.int64)
        self._env_tasks = [self._task_list[j] for j in idx]
        self._slots = [_Slot(item, cfg.image_size) for item in self._env_tasks]
        self._descriptions = [s.task.instruction for s in self._slots]
        self._instructions = encode_instructions(self._descriptions)
        self._spec = EnvSpec(state_dim=STATE_DIM, action_dim=ACTION_DIM, chunk_size=cfg.chunk_size,
                             num_envs=num_envs, max_episode_steps=cfg.max_episode_steps,
                             task_names=list(self._env_tasks))
        size = cfg.image_size
        self._images = np.zeros((num_envs, size, size, 3), np.uint8) if size else None
        self._states = np.zeros((num_envs, STATE_DIM), np.float32)
        self._ep_return = np.zeros(num_envs, np.float64)
        self._ep_length = np.zeros(num_envs, np.int32)
        self._ep_success = np.zeros(num_envs, bool)
        self._started = False

    @property
    def episode_seeds(self) -> list[int]:
        """The raw scene seed each env's current episode was built from (for logs and replays)."""
        return [s.episode_seed(self._list_index(s)) for s in self._slots]

    def _list_index(self, slot: "_Slot") -> int:
        """Seed-list entry of a slot's cursor: cursor // (number of task items), because envs (and
        the evaluator's seeds base + j * n + i) cycle over the n items, so each item walks its own
        list entry by entry instead of every n-th one. Split `any` takes the cursor as the seed."""
        return slot.cursor // len(self._task_list) if slot.seeds is not None else slot.cursor

    def reset(self, seeds: np.ndarray | None = None) -> dict:
        """New episodes everywhere; `seeds` index the split's seed list (see module docstring)."""
        if seeds is not None:
            seeds = check_seeds(seeds, self._num_envs)
            for slot, s in zip(self._slots, seeds):
                slot.cursor = int(s)
        elif not self._started:
            for i, slot in enumerate(self._slots):
                slot.cursor = self._cfg.seed + self._env_offset + i
        else:
            for slot in self._slots:
                slot.cursor += self._stride
        self._started = True
        for i in range(self._num_envs):
            self._reset_one(i, advance=False)
        return self._obs()

    def chunk_step(self, actions: np.ndarray) -> StepResult:
        """Run K substeps per env with auto-reset (see `rlfleet.envs.api`); episodes end by truncation only."""
        return self._chunk_step(actions)

    def expert_actions(self) -> np.ndarray:
        """The scripted expert's action at every env's current step, float32 [B, 8] (DAgger labels)."""
        return np.stack([s.expert.act(int(self._ep_length[i])) for i, s in enumerate(self._slots)])

    def expert_chunk_step(self, actions: np.ndarray,
                          use_expert: np.ndarray) -> tuple[StepResult, np.ndarray, np.ndarray]:
        """`chunk_step` that labels every visited state with the expert's action (as `MetaWorldEnv`)."""
        use_expert = np.asarray(use_expert, bool)
        if use_expert.shape != (self._num_envs,):
            raise ValueError(f"use_expert must be {self._num_envs} bools, got shape {use_expert.shape}")
        labels = np.zeros((self._num_envs, self._cfg.chunk_size, ACTION_DIM), np.float32)
        executed = np.zeros_like(labels)
        return self._chunk_step(actions, use_expert, labels, executed), labels, executed

    def _chunk_step(self, actions: np.ndarray, use_expert: np.ndarray | None = None,
                    labels: np.ndarray | None = None, executed: np.ndarray | None = None) -> StepResult:
        if not self._started:
            raise RuntimeError("call reset() before chunk_step()")
        B, K, D = self._num_envs, self._cfg.chunk_size, ACTION_DIM
        actions = np.asarray(actions)
        if actions.shape != (B, K, D):
            raise ValueError(f"actions must have shape (num_envs, chunk_size, action_dim) = ({B}, {K}, {D}), "
                             f"got {actions.shape}")
        actions = np.clip(actions.astype(np.float32, copy=False), -1.0, 1.0)
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        rtype = self._cfg.reward_type
        rewards = np.zeros((B, K), np.float32)
        success = np.zeros(B, bool)
        truncated = np.zeros(B, bool)
        terminated = np.zeros(B, bool)
        ep_return = np.zeros(B, np.float32)
        ep_length = np.zeros(B, np.int32)
        ep_success = np.zeros(B, bool)
        final_obs = self._blank_obs()
        for i, slot in enumerate(self._slots):
            for k in range(K):
                action = actions[i, k]
                if labels is not None:
                    labels[i, k] = slot.expert.act(int(self._ep_length[i]))
                    if use_expert is not None and use_expert[i]:
                        action = labels[i, k]
                    executed[i, k] = action
                slot.scene.apply_action(action)
                ok = slot.task.success()
                if rtype == "dense":
                    rewards[i, k] = slot.dense_reward(ok)
                elif rtype == "success_once":
                    rewards[i, k] = float(ok and not self._ep_success[i])
                else:
                    rewards[i, k] = float(ok)
                self._ep_return[i] += rewards[i, k]
                self._ep_length[i] += 1
                if ok:
                    success[i] = self._ep_success[i] = True
                terminated[i] = ok and self._cfg.terminate_on_success
                truncated[i] = self._ep_length[i] >= self._cfg.max_episode_steps and not terminated[i]
                if terminated[i] or truncated[i]:
                    ep_return[i], ep_length[i] = self._ep_return[i], self._ep_length[i]
                    ep_success[i] = self._ep_success[i]
                    final_obs["states"][i] = slot.state()
                    if self._images is not None:
                        final_obs["main_images"][i] = slot.scene.render()
                    self._reset_one(i, advance=True)
                    if labels is not None:
                        labels[i, k + 1:] = labels[i, k]
                        executed[i, k + 1:] = executed[i, k]
                    break
            else:
                self._states[i] = slot.state()
                if self._images is not None:
                    self._images[i] = slot.scene.render()
        return StepResult(obs=self._obs(), rewards=rewards, terminated=terminated, truncated=truncated,
                          success=success, episode_done=terminated | truncated, episode_return=ep_return,
                          episode_length=ep_length, episode_success_once=ep_success, final_obs=final_obs)

    def _reset_one(self, i: int, advance: bool) -> None:
        slot = self._slots[i]
        if advance:
            slot.cursor += self._stride
        slot.reset(slot.episode_seed(self._list_index(slot)))
        self._ep_return[i] = 0.0
        self._ep_length[i] = 0
        self._ep_success[i] = False
        self._states[i] = slot.state()
        if self._images is not None:
            self._images[i] = slot.scene.render()

    def close(self) -> None:
        self._slots = []
        self._started = False

    def _obs(self) -> dict:
        return batch_observation(self._states, self._instructions, self._task_ids, self._descriptions, self._images)

    def _blank_obs(self) -> dict:
        obs = {"states": np.zeros((self._num_envs, STATE_DIM), np.float32), "instructions": self._instructions.copy()}
        if self._images is not None:
            obs["main_images"] = np.zeros_like(self._images)
        return obs
