"""`CalvinEnv`: a batch of playtables, each episode a chain of 5 subtasks (CALVIN's long-horizon eval).

Episodes. Each episode is a `ChainSpec` from the train or eval pool (`EnvConfig.pool`): the scene
starts in the chain's initial state and the instruction observation (`instructions`,
`task_descriptions`) is the current subtask's; it switches to the next subtask's the step after
one completes. The episode terminates once all 5 are done, and is truncated when the current
subtask is not done within `SUBTASK_STEPS` env steps (CALVIN's 360) or the episode reaches
`EnvConfig.max_episode_steps` (set it to 5 * 360 = 1800 to let the per-subtask budget rule).

Reward. `reward_type` "success" and "dense": 1 on the step a subtask completes (no shaping: dense
is treated as sparse), so `episode_return` is the number of subtasks completed; "success_once":
1 only when the whole chain completes (return = chain success, 0/1). `episode_success_once` is
"all 5 done"; `success` marks chunks in which a chain completed. `last_chain_progress` holds, per
env, the subtasks its last finished episode completed, whatever the reward type.

Tasks. The "task" of an env is its scene variant: `EnvConfig.task` "D", "ABC" (each letter a
variant) or "A,B,C"; env i (global index env_offset + i) gets variant (env_offset + i) mod n and
`task_list` is ["calvin-A", ...]; `obs["task_ids"]` index into it.

Seeds. `reset(seeds)` starts env i on pool entry `seeds[i] % pool_size` (eval seeds 10000..10999
cover the 1000 eval chains once); its later episodes draw entries from a generator seeded by
`seeds[i]`. `reset()` without seeds draws every entry from a generator seeded by (cfg.seed,
env_offset + i). Everything in an episode (initial scene, chain, noise) follows from its entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlfleet.envs.api import (INSTRUCTION_BYTES, ChunkedEnv, EnvConfig, EnvSpec, StepResult, batch_observation,
                             check_env_args, check_seeds, encode_instructions)
from rlfleet.envs.calvin.chains import CHAIN_LENGTH, POOLS, ChainSpec, pool_entry, pool_size
from rlfleet.envs.calvin.experts import ExpertContext, expert_action
from rlfleet.envs.calvin.layout import VARIANTS, resolve_variants
from rlfleet.envs.calvin.scene import STATE_DIM, Scene, Snapshot
from rlfleet.envs.calvin.subtasks import SUBTASKS
from rlfleet.envs.calvin.symbolic import SymState

ACTION_DIM = 7
SUBTASK_STEPS = 360  # env steps allowed per subtask before the episode is truncated


@dataclass
class _Episode:
    chain: ChainSpec
    plan: list[SymState]
    start: Snapshot  # scene at the start of the current subtask
    stage: int = 0  # index of the current subtask (= subtasks completed)
    stage_steps: int = 0
    length: int = 0
    ret: float = 0.0

    @property
    def subtask(self) -> str:
        return self.chain.subtasks[min(self.stage, CHAIN_LENGTH - 1)]


class CalvinEnv(ChunkedEnv):
    """A batch of CALVIN-style playtables stepped in-process (one pybullet client per env)."""

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        check_env_args(cfg, num_envs, env_offset)
        if not 0 <= cfg.image_size <= 1024:
            raise ValueError(f"image_size must be 0 (no images) or 1..1024, got {cfg.image_size}")
        self._pool = getattr(cfg, "pool", "train")
        if self._pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self._pool!r}")
        self._cfg = cfg
        self._num_envs = num_envs
        self._env_offset = env_offset
        variants = resolve_variants(cfg.task)
        self._task_list = [f"calvin-{v}" for v in variants]
        idx = [(env_offset + i) % len(variants) for i in range(num_envs)]
        self._task_ids = np.asarray(idx, np.int64)
        self._variants = [VARIANTS[variants[j]] for j in idx]
        self._spec = EnvSpec(state_dim=STATE_DIM, action_dim=ACTION_DIM, chunk_size=cfg.chunk_size,
                             num_envs=num_envs, max_episode_steps=cfg.max_episode_steps,
                             task_names=[self._task_list[j] for j in idx])
        self._scenes = [Scene(v) for v in self._variants]
        self._size = cfg.image_size
        self._images = np.zeros((num_envs, self._size, self._size, 3), np.uint8) if self._size else None
        self._states = np.zeros((num_envs, STATE_DIM), np.float32)
        self._instructions = np.zeros((num_envs, INSTRUCTION_BYTES), np.uint8)
        self._descriptions = [""] * num_envs
        self._episodes: list[_Episode | None] = [None] * num_envs
        self._snaps: list[Snapshot | None] = [None] * num_envs
        self._rngs: list[np.random.Generator] | None = None
        self.last_chain_progress = np.zeros(num_envs, np.int32)

    # --- ChunkedEnv --------------------------------------------------------------------------------

    @property
    def pool(self) -> str:
        return self._pool

    def reset(self, seeds: np.ndarray | None = None) -> dict:
        n = pool_size(self._pool)
        if seeds is not None:
            seeds = check_seeds(seeds, self._num_envs)
            self._rngs = [np.random.default_rng(int(s)) for s in seeds]
            first = [int(s) % n for s in seeds]
        else:
            if self._rngs is None:
                self._rngs = [np.random.default_rng(np.random.SeedSequence([self._cfg.seed, self._env_offset + i]))
                              for i in range(self._num_envs)]
            first = [None] * self._num_envs
        for i in range(self._num_envs):
            self._start_episode(i, first[i])
            if self._images is not None:
                self._images[i] = self._scenes[i].render(self._size)
        return self._obs()

    def chunk_step(self, actions: np.ndarray) -> StepResult:
        return self._chunk_step(actions)

    def close(self) -> None:
        for scene in self._scenes:
            scene.close()
        self._scenes = []
        self._rngs = None

    # --- experts (DAgger labels, demos) ----------------------------------------------------------------

    def expert_actions(self) -> np.ndarray:
        """The scripted expert's action for every env's current subtask, float32 [B, 7] in [-1, 1]."""
        if self._rngs is None:
            raise RuntimeError("call reset() before expert_actions()")
        return np.stack([self._expert(i) for i in range(self._num_envs)])

    def expert_chunk_step(self, actions: np.ndarray,
                          use_expert: np.ndarray) -> tuple[StepResult, np.ndarray, np.ndarray]:
        """`chunk_step` that labels every visited state with the expert's action (as `MetaWorldEnv`'s).

        Env i executes the expert's action at each substep when `use_expert[i]`, else `actions[i, k]`;
        returns the result, `labels` [B, K, 7] and the `executed` actions [B, K, 7]; substeps skipped
        after an episode ended are padded with the last label / executed action.
        """
        use_expert = np.asarray(use_expert, dtype=bool)
        if use_expert.shape != (self._num_envs,):
            raise ValueError(f"use_expert must be {self._num_envs} bools, got shape {use_expert.shape}")
        labels = np.zeros((self._num_envs, self._cfg.chunk_size, ACTION_DIM), np.float32)
        executed = np.zeros_like(labels)
        return self._chunk_step(actions, use_expert, labels, executed), labels, executed

    def current_subtasks(self) -> list[str]:
        """Name of the subtask each env is working on."""
        return [ep.subtask if ep else "" for ep in self._episodes]

    def current_chains(self) -> list[ChainSpec]:
        return [ep.chain for ep in self._episodes if ep is not None]

    def render_gripper(self, size: int) -> np.ndarray:
        """Gripper-camera frames uint8 [B, size, size, 3] (not part of the observation)."""
        return np.stack([s.render_gripper(size) for s in self._scenes])

    # --- internals ---------------------------------------------------------------------------------

    def _expert(self, i: int) -> np.ndarray:
        ep, snap = self._episodes[i], self._snaps[i]
        assert ep is not None and snap is not None
        stage = min(ep.stage, CHAIN_LENGTH - 1)
        ctx = ExpertContext(SUBTASKS[ep.subtask], self._variants[i], ep.start, ep.plan[stage], ep.plan[stage + 1])
        return expert_action(ctx, snap)

    def _start_episode(self, i: int, index: int | None = None) -> None:
        assert self._rngs is not None
        if index is None:
            index = int(self._rngs[i].integers(pool_size(self._pool)))
        chain = pool_entry(self._pool, index)
        plan = chain.plan()
        scene = self._scenes[i]
        scene.reset(plan[0], np.random.default_rng([chain.init_seed, 2]))
        snap = scene.snapshot()
        self._episodes[i] = _Episode(chain, plan, snap)
        self._snaps[i] = snap
        self._states[i] = scene.state()
        self._set_instruction(i)

    def _set_instruction(self, i: int) -> None:
        ep = self._episodes[i]
        assert ep is not None
        text = SUBTASKS[ep.subtask].instruction
        self._descriptions[i] = text
        self._instructions[i] = encode_instructions([text])[0]

    def _chunk_step(self, actions: np.ndarray, use_expert: np.ndarray | None = None,
                    labels: np.ndarray | None = None, executed: np.ndarray | None = None) -> StepResult:
        if self._rngs is None:
            raise RuntimeError("call reset() before chunk_step()")
        B, K = self._num_envs, self._cfg.chunk_size
        actions = np.asarray(actions)
        if actions.shape != (B, K, ACTION_DIM):
            raise ValueError(f"actions must have shape (num_envs, chunk_size, action_dim) = ({B}, {K}, {ACTION_DIM}), "
                             f"got {actions.shape}")
        actions = np.clip(actions.astype(np.float32, copy=False), -1.0, 1.0)
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        once = self._cfg.reward_type == "success_once"
        rewards = np.zeros((B, K), np.float32)
        terminated, truncated, success = (np.zeros(B, bool) for _ in range(3))
        ep_return = np.zeros(B, np.float32)
        ep_length = np.zeros(B, np.int32)
        ep_success = np.zeros(B, bool)
        final_obs = self._blank_obs()

        for i, scene in enumerate(self._scenes):
            ep = self._episodes[i]
            assert ep is not None
            for k in range(K):
                action = actions[i, k]
                if labels is not None and executed is not None:
                    labels[i, k] = self._expert(i)
                    if use_expert is not None and use_expert[i]:
                        action = labels[i, k]
                    executed[i, k] = action
                scene.step(action)
                now = self._snaps[i] = scene.snapshot()
                ep.length += 1
                ep.stage_steps += 1
                if SUBTASKS[ep.subtask].success(ep.start, now):
                    ep.stage += 1
                    ep.stage_steps = 0
                    ep.start = now
                    rewards[i, k] = float(ep.stage == CHAIN_LENGTH) if once else 1.0
                    ep.ret += rewards[i, k]
                    if ep.stage == CHAIN_LENGTH:
                        terminated[i] = success[i] = True
                    else:
                        self._set_instruction(i)
                if not terminated[i] and (ep.stage_steps >= SUBTASK_STEPS or ep.length >= self._cfg.max_episode_steps):
                    truncated[i] = True
                if terminated[i] or truncated[i]:
                    ep_return[i], ep_length[i] = ep.ret, ep.length
                    ep_success[i] = ep.stage == CHAIN_LENGTH
                    self.last_chain_progress[i] = ep.stage
                    final_obs["states"][i] = scene.state()
                    final_obs["instructions"][i] = self._instructions[i]
                    if self._images is not None:
                        final_obs["main_images"][i] = scene.render(self._size)
                    self._start_episode(i)
                    if labels is not None and executed is not None:
                        labels[i, k + 1:] = labels[i, k]
                        executed[i, k + 1:] = executed[i, k]
                    break
            else:
                self._states[i] = scene.state()
            if self._images is not None:
                self._images[i] = scene.render(self._size)

        done = terminated | truncated
        return StepResult(obs=self._obs(), rewards=rewards, terminated=terminated, truncated=truncated,
                          success=success, episode_done=done, episode_return=ep_return, episode_length=ep_length,
                          episode_success_once=ep_success, final_obs=final_obs)

    def _obs(self) -> dict:
        return batch_observation(self._states, self._instructions, self._task_ids, self._descriptions, self._images)

    def _blank_obs(self) -> dict:
        B = self._num_envs
        obs = {"states": np.zeros((B, STATE_DIM), np.float32),
               "instructions": np.zeros((B, INSTRUCTION_BYTES), np.uint8)}
        if self._images is not None:
            obs["main_images"] = np.zeros_like(self._images)
        return obs
