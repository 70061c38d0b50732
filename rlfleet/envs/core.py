"""`EpisodeEnv`: the episode semantics of every in-process simulator, written once.

A simulator adapter subclasses `EpisodeEnv` and supplies per-env hooks only:

    reset_one(i, seed)      start a new episode in env i (seed: an int from `reset(seeds)`, else None)
    step_one(i, action)     one env step -> `Outcome(reward, success, terminated, truncated, sparse_reward)`
    state_one(i)            the current state vector of env i
    render_one(i)           the current `main_images` frame (only called when image_size > 0)
    render_wrist_one(i)     the current `wrist_images` frame (envs with WRIST_CAMERA; only with wrist_camera)
    instruction_one(i)      the current instruction text (re-read every step when `DYNAMIC_INSTRUCTIONS`)
    expert_one(i)           the scripted expert's action at env i's current state (expert-capable envs)

and everything else lives here: chunked stepping, action checks and clipping, auto-reset with
the final observation kept, `reward_type`, `terminate_on_success`, time-limit truncation,
episode return / length / success, seeds, and the expert-labelled chunk step of demos and DAgger.

Reward types (`EnvConfig.reward_type`): "dense" is `Outcome.reward`; "success" is
`Outcome.sparse_reward` when the env gives one (CALVIN: 1 per completed subtask) else
float(success); "success_once" is 1 on the first successful step of an episode only.
An episode ends terminated when the task says so or, with `terminate_on_success`, on its first
successful step; it is truncated (never both) at `max_episode_steps` or when the env says so.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rlfleet.envs.api import (
    INSTRUCTION_BYTES,
    ChunkedEnv,
    EnvConfig,
    EnvSpec,
    StepResult,
    batch_observation,
    check_env_args,
    check_seeds,
    encode_instructions,
)


class Outcome(NamedTuple):
    """What one env step reports to the episode core."""

    reward: float  # the simulator's dense reward
    success: bool  # the task counts as solved at this step
    terminated: bool = False  # the task itself ended the episode (no bootstrap)
    truncated: bool = False  # an env-specific budget ran out (the core adds max_episode_steps itself)
    sparse_reward: float | None = None  # reward_type "success" when not float(success)


class EpisodeEnv(ChunkedEnv):
    """A batch of B envs with the shared episode semantics; subclasses implement the hooks."""

    # Instructions that change within an episode (CALVIN chains) are re-read after every step.
    DYNAMIC_INSTRUCTIONS = False

    def _init_core(
        self,
        cfg: EnvConfig,
        num_envs: int,
        env_offset: int,
        state_dim: int,
        action_dim: int,
        task_list: list[str],
        action_low: float = -1.0,
        action_high: float = 1.0,
    ) -> None:
        """Check the config and set up shapes and buffers; env i runs task (env_offset + i) mod n.

        Call before building simulators, so a bad config fails fast.
        """
        check_env_args(cfg, num_envs, env_offset)
        if not 0 <= cfg.image_size <= 1024:
            raise ValueError(f"image_size must be 0 (no images) or 1..1024, got {cfg.image_size}")
        if cfg.wrist_camera and not self.WRIST_CAMERA:
            raise ValueError(f"env {cfg.name!r} has no wrist camera: set env.wrist_camera=false")
        if not task_list:
            raise ValueError("an env needs at least one task")
        self._cfg = cfg
        self._num_envs = num_envs
        self._env_offset = env_offset
        self._task_list = list(task_list)
        idx = [(env_offset + i) % len(task_list) for i in range(num_envs)]
        self._task_ids = np.asarray(idx, np.int64)
        self._env_tasks = [task_list[j] for j in idx]
        self._spec = EnvSpec(
            state_dim=state_dim,
            action_dim=action_dim,
            chunk_size=cfg.chunk_size,
            num_envs=num_envs,
            max_episode_steps=cfg.max_episode_steps,
            task_names=list(self._env_tasks),
            action_low=action_low,
            action_high=action_high,
        )
        size = cfg.image_size
        self._images = np.zeros((num_envs, size, size, 3), np.uint8) if size else None
        self._wrist = np.zeros((num_envs, size, size, 3), np.uint8) if size and cfg.wrist_camera else None
        self._states = np.zeros((num_envs, state_dim), np.float32)
        self._descriptions = [""] * num_envs
        self._instructions = np.zeros((num_envs, INSTRUCTION_BYTES), np.uint8)
        self._ep_return = np.zeros(num_envs, np.float64)
        self._ep_length = np.zeros(num_envs, np.int32)
        self._ep_success = np.zeros(num_envs, bool)
        self._started = False

    # --- hooks ---------------------------------------------------------------------------------

    def reset_one(self, i: int, seed: int | None) -> None:
        """Start a new episode in env i: `seed` from `reset(seeds)`, None for `reset()` and auto-reset."""
        raise NotImplementedError

    def step_one(self, i: int, action: np.ndarray) -> Outcome:
        """Apply one action (clipped float32 [D]) to env i."""
        raise NotImplementedError

    def state_one(self, i: int) -> np.ndarray:
        """Env i's current state vector [state_dim]."""
        raise NotImplementedError

    def render_one(self, i: int) -> np.ndarray:
        """Env i's current camera frame uint8 [H, W, 3] (called only when image_size > 0)."""
        raise NotImplementedError

    def render_wrist_one(self, i: int) -> np.ndarray:
        """Env i's current gripper-camera frame uint8 [H, W, 3] (called only with wrist_camera)."""
        raise NotImplementedError

    def instruction_one(self, i: int) -> str:
        """Env i's current instruction (by default its task name)."""
        return self._env_tasks[i]

    def expert_one(self, i: int) -> np.ndarray:
        """The scripted expert's action at env i's current state; envs without experts leave this out."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted expert")

    def episode_finished(self, i: int) -> None:
        """Called when env i's episode ends, before its auto-reset (for env-specific records)."""

    # --- capabilities --------------------------------------------------------------------------

    @property
    def has_expert(self) -> bool:
        """Whether this env overrides `expert_one` (what demos and DAgger need)."""
        return type(self).expert_one is not EpisodeEnv.expert_one

    # --- ChunkedEnv ----------------------------------------------------------------------------

    def reset(self, seeds: np.ndarray | None = None) -> dict:
        """New episodes everywhere; what a seed means is the env's own (see its `reset_one`)."""
        if seeds is not None:
            seeds = check_seeds(seeds, self._num_envs)
        for i in range(self._num_envs):
            self._begin(i, None if seeds is None else int(seeds[i]))
        self._started = True
        return self._obs()

    def chunk_step(self, actions: np.ndarray) -> StepResult:
        """Run K substeps per env with auto-reset (see `rlfleet.envs.api`)."""
        return self._chunk_step(actions)

    def expert_actions(self) -> np.ndarray:
        """The scripted expert's action at every env's current state, float32 [B, D]."""
        if not self._started:
            raise RuntimeError("call reset() before expert_actions()")
        lo, hi = self._spec.action_low, self._spec.action_high
        return np.stack([np.clip(np.asarray(self.expert_one(i), np.float32), lo, hi) for i in range(self._num_envs)])

    def expert_chunk_step(
        self, actions: np.ndarray, use_expert: np.ndarray
    ) -> tuple[StepResult, np.ndarray, np.ndarray]:
        """`chunk_step` that also labels every visited state with the scripted expert's action.

        Env i executes, at each of its K substeps, the expert's action at the state it is in
        (queried on the fly) when `use_expert[i]`, else `actions[i, k]`. Returns the step result,
        `labels` [B, K, D] (labels[i, k] = expert action at the state before substep k) and the
        `executed` actions [B, K, D]. Substeps skipped after an episode ended are padded with the
        last label / executed action (as `rlfleet.runs.sft.action_chunks` pads at episode ends).
        """
        use_expert = np.asarray(use_expert, dtype=bool)
        if use_expert.shape != (self._num_envs,):
            raise ValueError(f"use_expert must be {self._num_envs} bools, got shape {use_expert.shape}")
        labels = np.zeros((self._num_envs, self._cfg.chunk_size, self._spec.action_dim), np.float32)
        executed = np.zeros_like(labels)
        return self._chunk_step(actions, use_expert, labels, executed), labels, executed

    # --- the episode loop ----------------------------------------------------------------------

    def _begin(self, i: int, seed: int | None) -> None:
        self.reset_one(i, seed)
        self._ep_return[i] = 0.0
        self._ep_length[i] = 0
        self._ep_success[i] = False
        self._refresh(i)
        self._refresh_instruction(i)

    def _refresh(self, i: int) -> None:
        self._states[i] = self.state_one(i)
        if self._images is not None:
            self._images[i] = self.render_one(i)
        if self._wrist is not None:
            self._wrist[i] = self.render_wrist_one(i)

    def _refresh_instruction(self, i: int) -> None:
        text = self.instruction_one(i)
        if text != self._descriptions[i]:
            self._descriptions[i] = text
            self._instructions[i] = encode_instructions([text])[0]

    def _chunk_step(
        self,
        actions: np.ndarray,
        use_expert: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        executed: np.ndarray | None = None,
    ) -> StepResult:
        if not self._started:
            raise RuntimeError("call reset() before chunk_step()")
        B, K, D = self._num_envs, self._cfg.chunk_size, self._spec.action_dim
        actions = np.asarray(actions)
        if actions.shape != (B, K, D):
            raise ValueError(
                f"actions must have shape (num_envs, chunk_size, action_dim) = ({B}, {K}, {D}), got {actions.shape}"
            )
        lo, hi = self._spec.action_low, self._spec.action_high
        actions = np.clip(actions.astype(np.float32, copy=False), lo, hi)
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        rtype = self._cfg.reward_type
        stop_on_success = self._cfg.terminate_on_success
        max_steps = self._cfg.max_episode_steps
        dynamic = self.DYNAMIC_INSTRUCTIONS
        rewards = np.zeros((B, K), np.float32)
        success = np.zeros(B, bool)
        truncated = np.zeros(B, bool)
        terminated = np.zeros(B, bool)
        ep_return = np.zeros(B, np.float32)
        ep_length = np.zeros(B, np.int32)
        ep_success = np.zeros(B, bool)
        substeps = np.full(B, K, np.int32)  # simulated: fewer where an episode ends mid-chunk
        final_obs = self._blank_obs()

        for i in range(B):
            for k in range(K):
                action = actions[i, k]
                if labels is not None and executed is not None:
                    labels[i, k] = np.clip(np.asarray(self.expert_one(i), np.float32), lo, hi)
                    if use_expert is not None and use_expert[i]:
                        action = labels[i, k]
                    executed[i, k] = action
                out = self.step_one(i, action)
                ok = bool(out.success)
                if rtype == "dense":
                    rewards[i, k] = out.reward
                elif rtype == "success_once":  # the episode's return is its success (0/1)
                    rewards[i, k] = float(ok and not self._ep_success[i])
                else:
                    rewards[i, k] = float(ok) if out.sparse_reward is None else out.sparse_reward
                self._ep_return[i] += rewards[i, k]
                self._ep_length[i] += 1
                if ok:
                    success[i] = self._ep_success[i] = True
                if dynamic:
                    self._refresh_instruction(i)
                terminated[i] = bool(out.terminated) or (ok and stop_on_success)
                truncated[i] = not terminated[i] and (bool(out.truncated) or self._ep_length[i] >= max_steps)
                if terminated[i] or truncated[i]:
                    ep_return[i], ep_length[i] = self._ep_return[i], self._ep_length[i]
                    ep_success[i] = self._ep_success[i]
                    final_obs["states"][i] = self.state_one(i)
                    final_obs["instructions"][i] = self._instructions[i]
                    if self._images is not None:
                        final_obs["main_images"][i] = self.render_one(i)
                    if self._wrist is not None:
                        final_obs["wrist_images"][i] = self.render_wrist_one(i)
                    self.episode_finished(i)
                    self._begin(i, None)
                    substeps[i] = k + 1
                    if labels is not None and executed is not None:  # skipped substeps: pad
                        labels[i, k + 1 :] = labels[i, k]
                        executed[i, k + 1 :] = executed[i, k]
                    break
            else:
                self._refresh(i)
        return StepResult(
            obs=self._obs(),
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            success=success,
            episode_done=terminated | truncated,
            episode_return=ep_return,
            episode_length=ep_length,
            episode_success_once=ep_success,
            final_obs=final_obs,
            substeps=substeps,
        )

    def _obs(self) -> dict:
        return batch_observation(
            self._states, self._instructions, self._task_ids, self._descriptions, self._images, self._wrist
        )

    def _blank_obs(self) -> dict:
        """Zeroed tensor observations, filled in only for envs whose episode ends (`final_obs`)."""
        obs = {"states": np.zeros_like(self._states), "instructions": np.zeros_like(self._instructions)}
        if self._images is not None:
            obs["main_images"] = np.zeros_like(self._images)
        if self._wrist is not None:
            obs["wrist_images"] = np.zeros_like(self._wrist)
        return obs


# The third entropy word of a training env's episode stream. An integer reset seed s (evaluation,
# demos, GRPO groups; all < 2**64) is numpy entropy [s] == [s, 0, 0] or [lo, hi] == [lo, hi, 0]:
# with this word != 0 no training stream can equal an evaluation episode's, whatever env.seed is.
TRAIN_STREAM = 1
# A resumed run's training envs start from explicit reset seeds in [2**62, 2**63): above every
# evaluation seed and demo seed, so a new life never plays a held-out episode either.
RESUMED_SEED_BASE = 1 << 62


def entropy_seed(entropy: list[int], bits: int = 63) -> int:
    """A reset seed of `bits` bits (< 64) from SeedSequence(entropy): the first two 32-bit words,
    high word first, keeping the top bits. Distinct entropies collide with chance 2^-bits."""
    words = np.random.SeedSequence(entropy).generate_state(2, np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) >> (64 - bits)


def training_stream(resumed_from_env_steps: int, restarts: int = 0) -> int:
    """The training episode stream an actor process plays (see resumed_stream_seeds): 0 is a fresh
    run's first actor process (the envs' own streams); a resumed learner life's actors play the env
    steps it resumed from; an actor process restarted within a learner life (`restarts` > 0: its
    client id registered that often before) plays a hash of both at or above 2**62, above every
    env-step count, so no two lives of one actor share a stream."""
    if resumed_from_env_steps < 0 or restarts < 0:
        raise ValueError(f"resumed_from_env_steps and restarts must be >= 0, got {resumed_from_env_steps}, {restarts}")
    if restarts == 0:
        return resumed_from_env_steps
    return RESUMED_SEED_BASE | entropy_seed([resumed_from_env_steps, restarts, TRAIN_STREAM], bits=62)


def resumed_stream_seeds(base_seed: int, first_index: int, num_envs: int, stream: int) -> np.ndarray:
    """Reset seeds that start envs first_index.. on training episode stream `stream` (> 0, from
    training_stream: a resumed run's env steps, or a restarted actor's own): one per env from
    SeedSequence([base_seed, global index, TRAIN_STREAM, stream]), so each life of a run draws
    other episodes, reproducibly."""
    if stream <= 0:
        raise ValueError(f"stream must be > 0 (0 is a fresh run's own stream), got {stream}")
    entropies = ([base_seed, first_index + k, TRAIN_STREAM, stream] for k in range(num_envs))
    return np.array([RESUMED_SEED_BASE | entropy_seed(e, bits=62) for e in entropies], np.int64)


def episode_rng(
    rngs: list[np.random.Generator | None], i: int, seed: int | None, base_seed: int, global_index: int
) -> np.random.Generator:
    """Env i's episode generator: re-seeded by an explicit `seed`, else created once from
    (base_seed, global_index, TRAIN_STREAM) and continued, so repeated resets do not replay episodes."""
    if seed is not None:
        rngs[i] = np.random.default_rng(seed)
    elif rngs[i] is None:
        rngs[i] = np.random.default_rng(np.random.SeedSequence([base_seed, global_index, TRAIN_STREAM]))
    rng = rngs[i]
    assert rng is not None
    return rng
