"""A `ChunkedEnv` whose simulator runs behind EnvService: `env.name=remote://HOST:PORT`.

Everything that accepts an env name (actors' env workers, evaluation, the learner's shape
probe) gets this client from the registry. Each instance opens its own session on the server
with its batch size, global env offset, seed and chunk size, so a remote env is a drop-in for
the local one it replaces. The server decides the rest of the env config (task, episode
length, reward, rendering): set those on `rlfleet env-server`.

Options ride on the name as a query: `remote://127.0.0.1:50070?connect_timeout=10&timeout=30`
(seconds to wait for the server to answer at start-up, and for each call).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import grpc
import numpy as np

from rlfleet.envs.api import ChunkedEnv, EnvConfig, StepResult, encode_instructions
from rlfleet.envs.env_messages import decode_obs, decode_step, spec_from_reply
from rlfleet.wire import codec
from rlfleet.wire.gen import env_pb2, env_pb2_grpc
from rlfleet.wire.grpc_server import make_channel

log = logging.getLogger(__name__)
SCHEME = "remote"


class RemoteEnvError(RuntimeError):
    """The env server failed or sent something that is not a valid answer."""


@dataclass(frozen=True)
class RemoteTarget:
    """Where the env server is and how long to wait for it."""

    address: str  # HOST:PORT as gRPC takes it
    connect_timeout: float = 30.0
    timeout: float = 60.0


def parse_remote_name(name: str) -> RemoteTarget:
    """`remote://HOST:PORT[?connect_timeout=S&timeout=S]` -> RemoteTarget, with a clear error otherwise."""
    parts = urlsplit(name)
    if parts.scheme != SCHEME or not parts.netloc or parts.path not in ("", "/"):
        raise ValueError(f"remote env names look like {SCHEME}://HOST:PORT, got {name!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in remote env name {name!r}") from exc
    if port is None or not parts.hostname:
        raise ValueError(f"remote env name {name!r} needs a host and a port, e.g. {SCHEME}://127.0.0.1:50070")
    options: dict[str, float] = {}
    for key, values in parse_qs(parts.query, strict_parsing=bool(parts.query)).items():
        if key not in ("connect_timeout", "timeout"):
            raise ValueError(f"unknown option {key!r} in {name!r} (known: connect_timeout, timeout)")
        try:
            options[key] = float(values[-1])
        except ValueError as exc:
            raise ValueError(f"option {key!r} in {name!r} must be a number of seconds") from exc
        if options[key] <= 0:
            raise ValueError(f"option {key!r} in {name!r} must be positive")
    return RemoteTarget(parts.netloc, **options)


class RemoteEnv(ChunkedEnv):
    """A batch of `num_envs` envs hosted by an EnvService server (one session per instance)."""

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        self._target = parse_remote_name(cfg.name)
        self._cfg = cfg
        self._session = uuid.uuid4().hex
        self._channel = make_channel(self._target.address)
        try:
            self._wait_ready()
            self._stub = env_pb2_grpc.EnvServiceStub(self._channel)
            reply = self._call("GetSpec", env_pb2.SpecRequest(
                session_id=self._session, num_envs=num_envs, env_offset=env_offset, seed=cfg.seed,
                chunk_size=cfg.chunk_size))
            self._spec, self._task_list, self._obs_spec = self._checked_spec(reply, num_envs)
        except BaseException:
            self._channel.close()
            raise
        log.debug("session %s on %s (%s): %d envs from index %d", self._session, self._target.address,
                  reply.env_name or "?", num_envs, env_offset)
        index = {t: i for i, t in enumerate(self._task_list)}
        self._task_ids = np.asarray([index.get(t, 0) for t in self._spec.task_names], np.int64)
        self._closed = False

    # --- the Env API ------------------------------------------------------------------------

    @property
    def observation_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Per-env shape and dtype of each tensor observation the server sends."""
        return dict(self._obs_spec)

    def reset(self, seeds: np.ndarray | None = None) -> dict:
        """As `ChunkedEnv.reset`; seeds=None lets the server continue the session's seed sequence."""
        request = env_pb2.ResetRequest(session_id=self._session)
        if seeds is not None:
            seeds = np.asarray(seeds)
            if seeds.shape != (self._spec.num_envs,) or not np.issubdtype(seeds.dtype, np.integer):
                raise ValueError(f"seeds must be {self._spec.num_envs} ints, got shape {seeds.shape} dtype {seeds.dtype}")
            request.seeds.extend(int(s) for s in seeds)
        reply = self._call("Reset", request)
        return self._checked_obs(reply.obs)

    def chunk_step(self, actions: np.ndarray) -> StepResult:
        """As `ChunkedEnv.chunk_step`; shape/NaN errors come back from the server as ValueError."""
        arr = np.asarray(actions)
        if arr.dtype != np.float32 and (arr.dtype.kind in "fiu"):
            arr = arr.astype(np.float32)  # local envs take any real actions too
        reply = self._call("ChunkStep", env_pb2.ChunkStepRequest(
            session_id=self._session, actions=codec.encode_tensor("actions", arr)))
        obs = self._checked_obs(reply.obs)
        B, K = self._spec.num_envs, self._spec.chunk_size
        try:
            fields, final_obs = decode_step(reply.step, B, K)
        except codec.WireFormatError as exc:
            raise RemoteEnvError(f"env server {self._target.address} sent a bad step result: {exc}") from exc
        return StepResult(obs=obs, final_obs=self._checked_final(final_obs, obs), **fields)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._stub.Close(env_pb2.CloseRequest(session_id=self._session), timeout=min(5.0, self._target.timeout))
        except grpc.RpcError as exc:  # the server may be gone already; nothing left to free here
            log.debug("closing remote env session %s: %s", self._session, exc)
        self._channel.close()

    def __reduce__(self):
        raise TypeError("a RemoteEnv holds a live gRPC channel and cannot be pickled: call make_env() in the "
                        "process that steps it (env workers do)")

    # --- helpers ----------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        t = self._target
        try:
            grpc.channel_ready_future(self._channel).result(timeout=t.connect_timeout)
        except grpc.FutureTimeoutError:
            raise ConnectionError(
                f"env server {t.address} unreachable: no connection within {t.connect_timeout:g}s "
                f"(is `rlfleet env-server` or another EnvService server running there?)"
            ) from None

    def _call(self, rpc: str, request):
        """One unary call with the deadline; gRPC statuses become the errors a local env would raise."""
        t = self._target
        try:
            return getattr(self._stub, rpc)(request, timeout=t.timeout)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
            where = f"env server {t.address} ({rpc})"
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(f"{where}: {details}") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise ConnectionError(f"{where} unreachable: {details}") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"{where} did not answer within {t.timeout:g}s") from None
            raise RemoteEnvError(f"{where}: {code.name}: {details}") from None

    def _checked_spec(self, reply: env_pb2.EnvSpecReply, num_envs: int):
        try:
            spec, task_list, obs_spec = spec_from_reply(reply)
        except codec.WireFormatError as exc:
            raise RemoteEnvError(f"env server {self._target.address} sent a bad spec: {exc}") from exc
        if spec.num_envs != num_envs or spec.chunk_size != self._cfg.chunk_size:
            raise RemoteEnvError(
                f"env server {self._target.address} opened {spec.num_envs} envs of chunk size {spec.chunk_size}; "
                f"asked for {num_envs} of chunk size {self._cfg.chunk_size}"
            )
        size = self._cfg.image_size
        if size > 0 and obs_spec.get("main_images") != ((size, size, 3), "uint8"):
            have = obs_spec.get("main_images", "none")
            raise ValueError(
                f"env.image_size={size} but env server {self._target.address} sends main_images {have}: "
                f"start it with image_size={size}, or set env.image_size to match"
            )
        return spec, task_list, obs_spec

    def _checked_obs(self, msg) -> dict:
        """Decoded observations, checked against the spec, with derivable keys filled in."""
        B = self._spec.num_envs
        try:
            obs = decode_obs(msg)
            for key, (shape, dtype) in self._obs_spec.items():
                codec.require(obs, key, dtype, (B, *shape))
            if "task_ids" in obs:
                codec.require(obs, "task_ids", "int64", (B,))
        except codec.WireFormatError as exc:
            raise RemoteEnvError(f"env server {self._target.address} sent a bad observation: {exc}") from exc
        obs.setdefault("task_descriptions", list(self._spec.task_names))
        if "instructions" not in obs:
            obs["instructions"] = encode_instructions(obs["task_descriptions"])
        obs.setdefault("task_ids", self._task_ids.copy())
        return obs

    def _checked_final(self, final_obs: dict, obs: dict) -> dict:
        """`final_obs` for every tensor observation key; only instructions may be left to the client."""
        out = {}
        for key, value in obs.items():
            if key == "task_ids" or not isinstance(value, np.ndarray):
                continue
            if key in final_obs:
                if final_obs[key].shape != value.shape or final_obs[key].dtype != value.dtype:
                    raise RemoteEnvError(f"env server {self._target.address}: final_{key} is "
                                         f"{final_obs[key].dtype}{list(final_obs[key].shape)}, obs {key} is "
                                         f"{value.dtype}{list(value.shape)}")
                out[key] = final_obs[key]
            elif key == "instructions":
                out[key] = value.copy()
            else:
                raise RemoteEnvError(f"env server {self._target.address} sent no final_{key} "
                                     "(the observation finished episodes ended in)")
        return out
