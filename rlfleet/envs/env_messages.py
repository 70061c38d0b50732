"""EnvService messages <-> Env API objects, shared by the env server and the remote env client.

The wire carries exactly what `StepResult` carries: `obs` as a TensorMap (task descriptions in
its strings), the per-env step results in `step`, and `final_obs` as `final_<key>` entries of
`step`. Everything is raw tensors through `rlfleet.wire.codec`, never pickle.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlfleet.envs.api import EnvSpec, StepResult
from rlfleet.wire import codec
from rlfleet.wire.gen import env_pb2, tensor_pb2

ObsSpec = dict[str, tuple[tuple[int, ...], str]]
FINAL_PREFIX = "final_"
# StepResult fields carried in StepReply.step: name -> (dtype, trailing shape after [B]; "K" = chunk size)
STEP_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rewards": ("float32", ("K",)),
    "terminated": ("bool", ()),
    "truncated": ("bool", ()),
    "success": ("bool", ()),
    "episode_done": ("bool", ()),
    "episode_return": ("float32", ()),
    "episode_length": ("int32", ()),
    "episode_success_once": ("bool", ()),
}
# Optional in a reply (servers written before it leave it out; the client then derives it from
# episode_length, see RemoteEnv): substeps [B] int32, the substeps simulated in this chunk.
SUBSTEPS = "substeps"


def spec_reply(spec: EnvSpec, task_list: list[str], obs_spec: ObsSpec, env_name: str) -> env_pb2.EnvSpecReply:
    """Describe an env batch for GetSpec."""
    return env_pb2.EnvSpecReply(
        num_envs=spec.num_envs,
        state_dim=spec.state_dim,
        action_dim=spec.action_dim,
        chunk_size=spec.chunk_size,
        max_episode_steps=spec.max_episode_steps,
        task_names=list(spec.task_names),
        action_low=spec.action_low,
        action_high=spec.action_high,
        task_list=list(task_list),
        env_name=env_name,
        observations=[
            env_pb2.ObservationSpec(key=k, dtype=dtype, shape=list(shape)) for k, (shape, dtype) in obs_spec.items()
        ],
    )


def spec_from_reply(reply: env_pb2.EnvSpecReply) -> tuple[EnvSpec, list[str], ObsSpec]:
    """(EnvSpec, task list, observation spec) from a GetSpec reply, checked for consistency."""
    spec = EnvSpec(
        state_dim=reply.state_dim,
        action_dim=reply.action_dim,
        chunk_size=reply.chunk_size,
        num_envs=reply.num_envs,
        max_episode_steps=reply.max_episode_steps,
        task_names=list(reply.task_names),
        action_low=reply.action_low,
        action_high=reply.action_high,
    )
    if min(spec.state_dim, spec.action_dim, spec.chunk_size, spec.num_envs) < 1:
        raise codec.WireFormatError(
            f"spec needs positive num_envs, state_dim, action_dim and chunk_size, got {spec.num_envs}, "
            f"{spec.state_dim}, {spec.action_dim}, {spec.chunk_size}"
        )
    if len(spec.task_names) != spec.num_envs:
        raise codec.WireFormatError(f"spec names {len(spec.task_names)} tasks for {spec.num_envs} envs")
    if not spec.action_low < spec.action_high:  # an all-zero reply from a server that left them out
        spec.action_low, spec.action_high = -1.0, 1.0
    task_list = list(reply.task_list) or list(dict.fromkeys(spec.task_names))
    obs_spec: ObsSpec = {}
    for o in reply.observations:
        if o.dtype not in codec.ALLOWED_DTYPES or any(d < 0 for d in o.shape):
            raise codec.WireFormatError(f"observation {o.key!r}: bad dtype {o.dtype!r} or shape {list(o.shape)}")
        obs_spec[o.key] = (tuple(int(d) for d in o.shape), o.dtype)
    obs_spec.setdefault("states", ((spec.state_dim,), "float32"))
    if obs_spec["states"] != ((spec.state_dim,), "float32"):
        raise codec.WireFormatError(
            f"observation 'states' is {obs_spec['states']}, expected (({spec.state_dim},), 'float32')"
        )
    return spec, task_list, obs_spec


def obs_map(obs: Mapping[str, object]) -> tensor_pb2.TensorMap:
    return codec.encode_map(obs)  # type: ignore[arg-type]


def reset_reply(obs: Mapping[str, object], scenes: list[int] | None = None) -> env_pb2.StepReply:
    """A Reset's reply: the first observations, and the env's scene ids where it has them."""
    return env_pb2.StepReply(obs=obs_map(obs), episode_scenes=scenes or [])


def step_reply(result: StepResult) -> env_pb2.StepReply:
    """A StepResult as a StepReply: step fields plus `final_<key>` for each final observation."""
    step = {name: getattr(result, name) for name in (*STEP_FIELDS, SUBSTEPS)}
    step.update({FINAL_PREFIX + k: v for k, v in result.final_obs.items() if isinstance(v, np.ndarray)})
    return env_pb2.StepReply(obs=obs_map(result.obs), step=codec.encode_map(step))


def decode_obs(msg: tensor_pb2.TensorMap) -> dict:
    """Observation dict with writable arrays (the decoder's views are read-only protobuf bytes)."""
    return {k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in codec.decode_map(msg).items()}


def decode_step(msg: tensor_pb2.TensorMap, num_envs: int, chunk_size: int, finite: bool = True) -> tuple[dict, dict]:
    """(StepResult fields, final_obs) from StepReply.step, every field checked for dtype and shape
    (and NaN/inf unless `finite=False`: the remote client checks those per env). `substeps` is
    among the fields only when the reply has it."""
    raw = decode_obs(msg)
    fields = {}
    for name, (dtype, tail) in STEP_FIELDS.items():
        shape = [num_envs, *(chunk_size if d == "K" else d for d in tail)]
        fields[name] = codec.require(raw, name, dtype, shape, finite=finite)
    if SUBSTEPS in raw:
        sub = codec.require(raw, SUBSTEPS, "int32", [num_envs])
        if ((sub < 0) | (sub > chunk_size)).any():
            raise codec.WireFormatError(f"substeps {sub.tolist()} outside 0..{chunk_size}", reason="bad_substeps")
        fields[SUBSTEPS] = sub
    final_obs = {k[len(FINAL_PREFIX) :]: v for k, v in raw.items() if k.startswith(FINAL_PREFIX)}
    return fields, final_obs
