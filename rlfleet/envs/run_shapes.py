"""The shapes of a run's tensors from its env config and its run spec (`rlfleet.wire.run_spec`):
the env's dimensions (probed once, by whoever builds the spec), the observation tensors, and an
actor's shared-memory slots. Every role sizes the same tensors from the same two inputs."""

from __future__ import annotations

import dataclasses

from rlfleet.envs.api import EnvConfig, observation_spec
from rlfleet.envs.registry import make_env
from rlfleet.wire.run_spec import RunSpec
from rlfleet.wire.shm import Layout
from rlfleet.wire.slots import slot_layout


def probe_env_dims(env: EnvConfig) -> tuple[int, int]:
    """(state_dim, action_dim) of the env, from one env made without a renderer (shapes only)."""
    probe = make_env(dataclasses.replace(env, image_size=0, wrist_camera=False), 1)
    try:
        return probe.spec.state_dim, probe.spec.action_dim
    finally:
        probe.close()


def run_observation_spec(env: EnvConfig, spec: RunSpec) -> dict[str, tuple[tuple[int, ...], str]]:
    """The observation tensors of the run's env (per env: shape, dtype)."""
    return observation_spec(env, spec.state_dim)


def run_slot_layout(env: EnvConfig, spec: RunSpec, num_envs: int) -> Layout:
    """An actor's shared-memory slots for `num_envs` envs of the run's env and policy."""
    return slot_layout(
        num_envs,
        run_observation_spec(env, spec),
        spec.action_dim,
        env.chunk_size,
        spec.logprob_shape,
        spec.extras(),
    )
