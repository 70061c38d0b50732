"""`CalvinEnv`: a batch of playtables, each episode a chain of 5 subtasks (CALVIN's long-horizon eval).

Episodes. Each episode is a `ChainSpec` from the train, eval (test) or validation pool (`env.pool`): the scene
starts in the chain's initial state and the instruction observation (`instructions`,
`task_descriptions`) is the current subtask's; it switches to the next subtask's the step after
one completes. The episode terminates once all 5 are done, and is truncated when the current
subtask is not done within `EnvConfig.subtask_steps` env steps (0: `SUBTASK_STEPS`, CALVIN's 360)
or the episode reaches `EnvConfig.max_episode_steps` (set it to 5 * 360 = 1800 to let the
per-subtask budget rule).

Reward. `reward_type` "success" and "dense": 1 on the step a subtask completes (dense is treated
as sparse), so `episode_return` is the number of subtasks completed; `progress_reward` w in [0, 1)
adds potential-based shaping for the block subtasks (`shaping.py`: the hand nearing the named
block, holding it while lifting), which keeps returns within 0.5 of that number; "success_once":
1 only when the whole chain completes (return = chain success, 0/1). `episode_success_once` is
"all 5 done"; `success` marks chunks in which a chain completed (success and termination
coincide, so `terminate_on_success` changes nothing here). `last_chain_progress` holds, per
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

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.calvin.chains import (
    CHAIN_LENGTH,
    ChainSpec,
    check_pools_disjoint,
    pool_entry,
    pool_size,
)
from rlfleet.envs.calvin.config import CalvinEnvConfig
from rlfleet.envs.calvin.experts import ExpertContext, expert_action
from rlfleet.envs.calvin.layout import VARIANTS, resolve_variants
from rlfleet.envs.calvin.scene import STATE_DIM, Scene, Snapshot
from rlfleet.envs.calvin.shaping import block_progress
from rlfleet.envs.calvin.subtasks import SUBTASKS
from rlfleet.envs.calvin.symbolic import SymState
from rlfleet.envs.core import EpisodeEnv, Outcome, episode_rng

ACTION_DIM = 7
SUBTASK_STEPS = 360  # env steps allowed per subtask before the episode is truncated


@dataclass
class _Episode:
    chain: ChainSpec
    plan: list[SymState]
    start: Snapshot  # scene at the start of the current subtask
    stage: int = 0  # index of the current subtask (= subtasks completed)
    stage_steps: int = 0
    steps: int = 0  # env steps of the whole episode (max_episode_steps ends it)
    progress: float = 0.0  # block progress of the last step's scene and stage (progress_reward)

    @property
    def subtask(self) -> str:
        return self.chain.subtasks[min(self.stage, CHAIN_LENGTH - 1)]


class CalvinEnv(EpisodeEnv):
    """A batch of CALVIN-style playtables stepped in-process (one pybullet client per env)."""

    DYNAMIC_INSTRUCTIONS = True  # the instruction moves on to the next subtask of the chain
    CHAIN_LENGTH = CHAIN_LENGTH  # chained-instruction env: returns count subtasks done in a row
    GRIPPER_ACTION_DIMS = (6,)  # position and orientation deltas, then the gripper
    WRIST_CAMERA = True  # CALVIN's gripper camera (`wrist_images` with env.wrist_camera)
    CONFIG_CLASS = CalvinEnvConfig
    _cfg: CalvinEnvConfig

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        cfg = CalvinEnvConfig.of(cfg)
        self._pool = cfg.pool
        if not 0 <= cfg.progress_reward < 1 or (cfg.progress_reward and cfg.reward_type == "success_once"):
            raise ValueError(
                "CALVIN's progress_reward must be in [0, 1) (returns must round to the subtasks done) and "
                f"needs reward_type 'success' or 'dense', got {cfg.progress_reward} with {cfg.reward_type!r}"
            )
        variants = resolve_variants(cfg.task)
        self._init_core(cfg, num_envs, env_offset, STATE_DIM, ACTION_DIM, [f"calvin-{v}" for v in variants])
        self._variants = [VARIANTS[variants[j]] for j in self._task_ids]
        self._scenes = [Scene(v) for v in self._variants]
        self._size = cfg.image_size
        self._subtask_steps = cfg.subtask_steps or SUBTASK_STEPS
        self._episodes: list[_Episode | None] = [None] * num_envs
        self._pool_indices = [0] * num_envs  # the pool entry each env's episode plays
        self._snaps: list[Snapshot | None] = [None] * num_envs
        self._rngs: list[np.random.Generator | None] = [None] * num_envs
        self.last_chain_progress = np.zeros(num_envs, np.int32)

    @property
    def pool(self) -> str:
        return self._pool

    @classmethod
    def check_held_out_splits(cls, cfg: EnvConfig, test_seeds: range, validation_seeds: range) -> None:
        """The validation chains a run plays are none of the test chains it plays (train chains are
        other chains by construction: `chains.chain_split`)."""
        check_pools_disjoint(test_seeds, validation_seeds)

    def close(self) -> None:
        for scene in self._scenes:
            scene.close()
        self._scenes = []
        self._started = False

    def current_subtasks(self) -> list[str]:
        """Name of the subtask each env is working on."""
        return [ep.subtask if ep else "" for ep in self._episodes]

    def episode_scenes(self) -> list[int]:
        """The pool entries: seeds that differ by the pool's size play the same chain."""
        return list(self._pool_indices)

    def current_chains(self) -> list[ChainSpec]:
        return [ep.chain for ep in self._episodes if ep is not None]

    def render_gripper(self, size: int) -> np.ndarray:
        """Gripper-camera frames uint8 [B, size, size, 3] at any size (the observation's are
        `wrist_images`, with env.wrist_camera)."""
        return np.stack([s.render_gripper(size) for s in self._scenes])

    # --- EpisodeEnv hooks ------------------------------------------------------------------------

    def reset_one(self, i: int, seed: int | None) -> None:
        """Pool entry `seed % pool_size` when seeded (later episodes: a generator seeded by `seed`),
        else an entry drawn from env i's generator (seeded by cfg.seed and its global index)."""
        rng = episode_rng(self._rngs, i, seed, self._cfg.seed, self._env_offset + i)
        index = seed % pool_size(self._pool) if seed is not None else int(rng.integers(pool_size(self._pool)))
        chain = pool_entry(self._pool, index)
        self._pool_indices[i] = index
        plan = chain.plan()
        scene = self._scenes[i]
        scene.reset(plan[0], np.random.default_rng([chain.init_seed, 2]))
        snap = scene.snapshot()
        self._episodes[i] = _Episode(chain, plan, snap, progress=block_progress(SUBTASKS[chain.subtasks[0]], snap))
        self._snaps[i] = snap

    def step_one(self, i: int, action: np.ndarray) -> Outcome:
        """Reward 1 when a subtask completes (plus w times the change of block progress); success
        and termination: the whole chain."""
        ep = self._episodes[i]
        assert ep is not None
        scene = self._scenes[i]
        scene.step(action)
        now = self._snaps[i] = scene.snapshot()
        ep.stage_steps += 1
        ep.steps += 1
        done_subtask = SUBTASKS[ep.subtask].success(ep.start, now)
        if done_subtask:
            ep.stage += 1
            ep.stage_steps = 0
            ep.start = now
        chain_done = ep.stage == CHAIN_LENGTH
        failed = ep.stage_steps >= self._subtask_steps
        ends = chain_done or failed or ep.steps >= self._cfg.max_episode_steps
        progress = 0.0 if ends else block_progress(SUBTASKS[ep.subtask], now)  # 0 at the episode's end
        reward = float(done_subtask) + self._cfg.progress_reward * (progress - ep.progress)
        ep.progress = progress
        return Outcome(reward, chain_done, terminated=chain_done, truncated=failed, sparse_reward=reward)

    def state_one(self, i: int) -> np.ndarray:
        return self._scenes[i].state()

    def render_one(self, i: int) -> np.ndarray:
        return self._scenes[i].render(self._size)

    def render_wrist_one(self, i: int) -> np.ndarray:
        return self._scenes[i].render_gripper(self._size)

    def instruction_one(self, i: int) -> str:
        ep = self._episodes[i]
        return SUBTASKS[ep.subtask].instruction if ep is not None else ""

    def expert_one(self, i: int) -> np.ndarray:
        """The scripted expert's action for env i's current subtask, in [-1, 1]."""
        ep, snap = self._episodes[i], self._snaps[i]
        assert ep is not None and snap is not None
        stage = min(ep.stage, CHAIN_LENGTH - 1)
        ctx = ExpertContext(SUBTASKS[ep.subtask], self._variants[i], ep.start, ep.plan[stage], ep.plan[stage + 1])
        return expert_action(ctx, snap)

    def episode_finished(self, i: int) -> None:
        ep = self._episodes[i]
        self.last_chain_progress[i] = ep.stage if ep is not None else 0
