"""Simulator envs behind one batched, chunked, auto-resetting API (`ChunkedEnv`); in-process
simulators supply per-env hooks to the shared episode core (`EpisodeEnv`)."""

from rlfleet.envs.api import ChunkedEnv, EnvConfig, EnvSpec, StepResult
from rlfleet.envs.core import EpisodeEnv, Outcome, episode_rng
from rlfleet.envs.registry import make_env, register_env

__all__ = [
    "ChunkedEnv",
    "EnvConfig",
    "EnvSpec",
    "EpisodeEnv",
    "Outcome",
    "StepResult",
    "episode_rng",
    "make_env",
    "register_env",
]
