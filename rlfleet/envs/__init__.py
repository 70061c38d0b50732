"""Simulator envs behind one batched, chunked, auto-resetting API (`ChunkedEnv`)."""

from rlfleet.envs.api import ChunkedEnv, EnvConfig, EnvSpec, StepResult
from rlfleet.envs.registry import make_env, register_env

__all__ = ["ChunkedEnv", "EnvConfig", "EnvSpec", "StepResult", "make_env", "register_env"]
