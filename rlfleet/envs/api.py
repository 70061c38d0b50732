"""The simulator-independent env API: a batch of B envs stepped K actions (one chunk) at a time.

Every simulator adapter (MetaWorld, RoboTwin, CALVIN, any gymnasium id, a remote EnvService
server, a plugin) implements `ChunkedEnv`, so actors, evaluators and the wire layer never see
simulator types. Observation keys follow RLinf (`main_images`, `states`, `instructions`,
`task_ids`, `task_descriptions`) so policies port over unchanged.

Semantics shared by all adapters:

* Auto-reset: an env whose episode ends at substep k of a chunk records its episode stats,
  resets at once and ignores the rest of the chunk (reward 0 for those substeps); the obs
  returned for it is the new episode's first obs, and `final_obs` keeps the observation the old
  episode ended in (needed to bootstrap the value of a truncated episode).
* Actions are clipped to [action_low, action_high].
"""

import abc
import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

# Held-out evaluation splits, the one place their seeds start. `test` is what results report;
# `validation` is what every choice made by looking at success (decoders, hyperparameters, demo
# counts, checkpoints) is made on, so the test episodes stay unseen. Seed-keyed envs (MetaWorld,
# gymnasium, the bench env, plugins) play a split's episode j of task i from reset seed
# base + j * tasks + i (`eval.seed` / `eval.validation_seed`, defaults below); envs with their own
# held-out sets also select them in `EnvConfig.held_out` (SPLIT_POOL: the `pool` setting of
# CALVIN's chain pools and RoboTwin's seed files).
# Demo seeds start at rlfleet.data.demos.DEMO_SEED_BASE (1_000_000), above both ranges.
EVAL_SPLITS = ("test", "validation")
TEST_SEED_BASE = 10_000
VALIDATION_SEED_BASE = 500_000
SPLIT_POOL = {"test": "eval", "validation": "validation"}


_C = TypeVar("_C", bound="EnvConfig")


@dataclass
class EnvConfig:
    """Which simulator and tasks to run: the settings every env reads. Simple types only, so it works
    as an OmegaConf structured config.

    Each simulator family declares its own settings in a subclass next to its code (MetaWorld's
    goal marker, CALVIN's subtask budget, ...), registered by env name (`rlfleet.envs.registry.
    env_config_class`); envs that declare none (the bench env, remote envs, plugins) use this class.
    The run config types its `env` and `eval_env` sections with the env's class, so a setting of
    another family is a one-line error."""

    name: str = "metaworld"
    # What the simulator plays, in its own terms (MetaWorld: a task "reach-v3", a set "MT10" or a
    # comma-separated list; CALVIN: scene variants); empty for envs that take none (gym:<id>, plugins).
    task: str = ""
    max_episode_steps: int = 150  # env steps (not chunks) before an episode is truncated
    chunk_size: int = 1  # K: actions executed per policy query
    seed: int = 0
    # "dense": the simulator's shaped reward; "success": 1 for every step the task counts as
    # solved, else 0 (what success_once measures, as RLinf's sparse rewards); "success_once": 1 on
    # the first solved step of an episode only, so an episode's return is its success (0 or 1; GRPO)
    reward_type: str = "dense"
    # End the episode (terminated, no bootstrap) on the first solved step, as RLinf does with
    # ignore_terminations=False. Success_once is unchanged; the critic then never has to value the
    # frames after a success, which look like the frames just before one but earn nothing more.
    terminate_on_success: bool = False
    image_size: int = 0  # side of the square `main_images` camera frame; 0: state-only (no renderer)
    camera: str = "corner"  # simulator camera for `main_images`
    # Also render the env's gripper (wrist) camera into `wrist_images`, at image_size like
    # `main_images` (RLinf's key). Needs image_size > 0 and an env that has one (`WRIST_CAMERA`).
    wrist_camera: bool = False
    # Envs in the whole fleet (actors set it to num_actors x num_envs; 0: this batch alone). Envs that
    # walk a seed list (RoboTwin) stride by it, so workers and actors never replay each other's seeds.
    fleet_envs: int = 0

    def held_out(self: _C, split: str) -> _C:
        """These settings as evaluation on held-out `split` plays them (EVAL_SPLITS). By default the
        same: a seed-keyed env's split is its episode seeds (`eval.seed` / `eval.validation_seed`);
        a family with its own held-out sets (CALVIN's chain pools, RoboTwin's seed files) selects
        the split's here."""
        if split not in EVAL_SPLITS:
            raise ValueError(f"evaluation split must be one of {', '.join(EVAL_SPLITS)}, got {split!r}")
        return dataclasses.replace(self)

    @classmethod
    def of(cls: type[_C], cfg: "EnvConfig") -> _C:
        """`cfg` as this class: its settings, this class's defaults for the rest (an env built
        from a plain EnvConfig); a ValueError when `cfg` holds a setting this class lacks."""
        if isinstance(cfg, cls):
            return cfg
        own = {f.name for f in dataclasses.fields(cls)}
        given = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        extra = [k for k in given if k not in own]
        if extra:
            raise ValueError(f"env.{extra[0]} of env {cfg.name} is not a setting of {cls.__name__}")
        return cls(**given)


INSTRUCTION_BYTES = 128  # fixed width of the `instructions` observation (UTF-8, zero padded)


def encode_instructions(texts: list[str], width: int = INSTRUCTION_BYTES) -> np.ndarray:
    """Instructions as uint8 [B, width]: raw text travels as a tensor, each policy tokenises it itself."""
    out = np.zeros((len(texts), width), np.uint8)
    for i, text in enumerate(texts):
        raw = text.encode("utf-8")
        if len(raw) > width:
            raise ValueError(f"instruction longer than {width} bytes: {text!r}")
        out[i, : len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def decode_instructions(arr: np.ndarray) -> list[str]:
    return [bytes(row).rstrip(b"\0").decode("utf-8", errors="replace") for row in np.asarray(arr, np.uint8)]


def check_env_args(cfg: EnvConfig, num_envs: int, env_offset: int) -> None:
    """The constructor checks every in-process adapter makes: clear errors for a bad batch or config
    (a family's own settings check themselves: its config class's __post_init__)."""
    if num_envs < 1 or env_offset < 0:
        raise ValueError(f"need num_envs >= 1 and env_offset >= 0, got {num_envs}, {env_offset}")
    if cfg.chunk_size < 1 or cfg.max_episode_steps < 1:
        raise ValueError(
            f"chunk_size and max_episode_steps must be >= 1, got {cfg.chunk_size}, {cfg.max_episode_steps}"
        )
    if cfg.wrist_camera and cfg.image_size <= 0:
        raise ValueError("wrist_camera renders at image_size: set env.image_size > 0 too")
    if cfg.reward_type not in ("dense", "success", "success_once"):
        raise ValueError(f"reward_type must be 'dense', 'success' or 'success_once', got {cfg.reward_type!r}")


def check_seeds(seeds: np.ndarray | list, num_envs: int) -> np.ndarray:
    """`ChunkedEnv.reset` seeds as an int array of one seed per env, or a clear error."""
    seeds = np.asarray(seeds)
    if seeds.shape != (num_envs,) or not np.issubdtype(seeds.dtype, np.integer):
        raise ValueError(f"seeds must be {num_envs} ints, got shape {seeds.shape} dtype {seeds.dtype}")
    return seeds


def batch_observation(
    states: np.ndarray,
    instructions: np.ndarray,
    task_ids: np.ndarray,
    descriptions: list[str],
    images: np.ndarray | None,
    wrist_images: np.ndarray | None = None,
) -> dict:
    """The observation dict of an in-process adapter, as copies: the adapter keeps reusing its buffers."""
    obs = {
        "states": states.copy(),
        "instructions": instructions.copy(),
        "task_ids": task_ids.copy(),
        "task_descriptions": list(descriptions),
    }
    if images is not None:
        obs["main_images"] = images.copy()
    if wrist_images is not None:
        obs["wrist_images"] = wrist_images.copy()
    return obs


def observation_spec(cfg: "EnvConfig", state_dim: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Per-env shape and dtype of every tensor observation key (what slots and segments carry)."""
    spec: dict[str, tuple[tuple[int, ...], str]] = {
        "states": ((state_dim,), "float32"),
        "instructions": ((INSTRUCTION_BYTES,), "uint8"),
    }
    if cfg.image_size > 0:
        spec["main_images"] = ((cfg.image_size, cfg.image_size, 3), "uint8")
        if cfg.wrist_camera:
            spec["wrist_images"] = ((cfg.image_size, cfg.image_size, 3), "uint8")
    return spec


@dataclass
class EnvSpec:
    """Static shape information about one env batch, what a policy or buffer needs to size itself."""

    state_dim: int
    action_dim: int
    chunk_size: int
    num_envs: int
    max_episode_steps: int
    task_names: list[str]  # the task of each env, length num_envs
    action_low: float = -1.0
    action_high: float = 1.0


@dataclass
class StepResult:
    """What one `chunk_step` returns for a batch of B envs, chunk size K and state dim S.

    `episode_return`, `episode_length`, `episode_success_once` and `final_obs` are only
    meaningful where `episode_done` is True (zero elsewhere).
    """

    obs: dict  # states [B,S] float32, instructions [B,L] uint8, main_images [B,H,W,3] uint8 (when
    # rendering; wrist_images too with wrist_camera), task_ids [B] int64, task_descriptions list[str] (len B)
    rewards: np.ndarray  # [B,K] float32; 0 for substeps skipped after an episode ended
    terminated: np.ndarray  # [B] bool: episode ended by the task itself during this chunk
    truncated: np.ndarray  # [B] bool: episode hit max_episode_steps during this chunk
    success: np.ndarray  # [B] bool: success reported at any executed substep of this chunk
    episode_done: np.ndarray  # [B] bool: terminated | truncated
    episode_return: np.ndarray  # [B] float32: sum of raw rewards of the finished episode
    episode_length: np.ndarray  # [B] int32: env steps of the finished episode
    episode_success_once: np.ndarray  # [B] bool: success at any step of the finished episode
    final_obs: dict  # the tensor keys of `obs` ([B,...] each): last observation of the finished episode
    # [B] int32: substeps simulated in this chunk: K, or fewer where the episode ended mid-chunk
    # (the rest of the chunk is skipped). Env steps count these, never K per chunk.
    substeps: np.ndarray


class ChunkedEnv(abc.ABC):
    """A batch of auto-resetting envs stepped one action chunk at a time."""

    # Adapters set `self._spec` in __init__, and `self._task_list` when a batch may see only some
    # of the config's tasks (a slice of a MetaWorld task set, a remote env's whole list).
    _spec: EnvSpec
    _task_list: list[str] | None = None

    # Declared capabilities (generic modules read these, never a simulator's name):
    # the env's settings class (an EnvConfig subclass holding its own keys; `rlfleet.envs.registry.
    # env_config_class`), which its constructor receives.
    CONFIG_CLASS: type[EnvConfig] = EnvConfig
    # an episode is a chain of CHAIN_LENGTH instructions whose return counts those done in a row
    # (CALVIN's metrics); 0 for an ordinary env.
    CHAIN_LENGTH: int = 0
    # The action dims that are absolute gripper commands, where every other dim moves the arm
    # relative to where it is commanded to be (0: stay), so a demo frame with zero motion and an
    # unchanged gripper command is the expert waiting (sft.drop_noop_frames). None: not declared.
    GRIPPER_ACTION_DIMS: tuple[int, ...] | None = None
    # The env can render a gripper (wrist) camera into `wrist_images` (EnvConfig.wrist_camera).
    WRIST_CAMERA: bool = False
    # Raised when a fix changes the demos collected for the same seeds (their frames, or the
    # expert's actions), so cached demos (rlfleet.runs.bootstrap) are collected again, not reused.
    DEMOS_REVISION: int = 0

    @classmethod
    def check_held_out_splits(cls, cfg: "EnvConfig", test_seeds: range, validation_seeds: range) -> None:
        """A one-line ValueError if the env's own validation episodes (played from `validation_seeds`,
        pool "validation") meet its test or training ones. Nothing to check by default: a seed-keyed
        env's splits are their seed ranges, which `rlfleet.eval.splits.eval_seed_range` checks."""
        return None

    @staticmethod
    def task_groups() -> dict[str, list[str]]:
        """Named groups of tasks an evaluation report averages over (MetaWorld: difficulty levels
        and ML45 held-out); none by default."""
        return {}

    @classmethod
    def config_tasks(cls, cfg: "EnvConfig") -> list[str] | None:
        """The task list a config gives without building an env, when the env can say (None: build one to ask)."""
        return None

    @property
    def has_expert(self) -> bool:
        """Whether `expert_actions()` and `expert_chunk_step()` work (scripted demos, DAgger)."""
        return False

    @property
    def spec(self) -> EnvSpec:
        """Shapes and task assignment of this batch."""
        return self._spec

    @property
    def task_list(self) -> list[str]:
        """Every task of the env config, in order: what `obs["task_ids"]` index into (by default
        the tasks this batch holds)."""
        if self._task_list is not None:
            return list(self._task_list)
        return list(dict.fromkeys(self.spec.task_names))

    def episode_scenes(self) -> list[int] | None:
        """An id of each env's current episode's starting state, for matching one evaluation's
        episodes with another's where the reset seed alone does not name it (an env that maps
        seeds onto a finite list, so another seed or another batch layout replays the same scene;
        rlfleet.eval.paired); None: the reset seed names it. Evaluation reads it right after
        `reset`; a remote env gives the ids of the episodes its last reset started."""
        return None

    @abc.abstractmethod
    def reset(self, seeds: np.ndarray | None = None) -> dict:
        """Start a new episode in every env and return the observation dict.

        `seeds` holds one int per env and makes the episodes reproducible (same seeds, same
        initial states). None derives seeds deterministically from `EnvConfig.seed` and each
        env's global index.
        """

    @abc.abstractmethod
    def chunk_step(self, actions: np.ndarray) -> StepResult:
        """Execute `actions` float32 [B,K,D] (K substeps per env), auto-resetting finished episodes."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release simulator resources."""

    def __enter__(self) -> "ChunkedEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
