"""A `ChunkedEnv` whose simulator runs behind EnvService: `env.name=remote://HOST:PORT`.

Everything that accepts an env name (actors' env workers, evaluation, the learner's shape
probe) gets this client from the registry. Each instance opens its own session on the server
with its batch size, global env offset, seed and chunk size, so a remote env is a drop-in for
the local one it replaces. The server decides the rest of the env config (task, episode
length, reward, rendering): set those on `rlfleet env-server`.

Options ride on the name as a query: `remote://127.0.0.1:50070?connect_timeout=10&timeout=30&reconnect_timeout=60`
(seconds to wait for the server to answer at start-up, for each call, and for a lost server to
come back; 0 turns reconnecting off).

A failing simulator costs episodes, not the actor: the client numbers its ChunkSteps (a call
that timed out is retried under the same number, so the server never applies it twice); a
server that went away, restarted or lost the session is reopened within `reconnect_timeout`,
every episode in flight ending as truncated; NaN/inf in one env's reward or observation ends
that env's episode (truncated, reward 0, the policy sees its last good observation). Each of
these is counted in `RemoteEnv.faults` and logged, naming the simulator.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import grpc
import numpy as np

from rlfleet.envs.api import ChunkedEnv, EnvConfig, StepResult, encode_instructions
from rlfleet.envs.env_messages import decode_obs, decode_step, spec_from_reply
from rlfleet.wire import codec
from rlfleet.wire.gen import env_pb2, env_pb2_grpc
from rlfleet.wire.grpc_server import make_channel
from rlfleet.wire.join import EXIT_BAD_INPUT, CommandError

log = logging.getLogger(__name__)
SCHEME = "remote"


class RemoteEnvError(CommandError):
    """The env server failed or sent something that is not a valid answer: bad input to a command
    (exit 2), its message says which server and how."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_BAD_INPUT)


@dataclass(frozen=True)
class RemoteTarget:
    """Where the env server is and how long to wait for it."""

    address: str  # HOST:PORT as gRPC takes it
    connect_timeout: float = 30.0
    timeout: float = 60.0
    reconnect_timeout: float = 60.0  # 0: a lost server or session is an error at once


OPTIONS = ("connect_timeout", "timeout", "reconnect_timeout")
# Statuses after which the session is reopened: the server is gone or restarted (UNAVAILABLE),
# it lost or closed the session or saw a step lost (FAILED_PRECONDITION), the simulator raised
# (INTERNAL). Bad input of ours (INVALID_ARGUMENT) stays an error: reopening would not fix it.
_REOPEN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INTERNAL)
MAX_BAD_OBS_STREAK = 3  # chunks in a row one env sends NaN/inf observations before the session is reset
MAX_RECOVERIES_IN_A_ROW = 5  # reopenings with no good step in between: the server is broken, stop
_warned: set[str] = set()  # settings the server overrides: warned once per process


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


class _Lost(Exception):
    """The session is gone (server restarted, session closed, step lost, simulator raised)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code


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
        if key not in OPTIONS:
            raise ValueError(f"unknown option {key!r} in {name!r} (known: {', '.join(OPTIONS)})")
        try:
            options[key] = float(values[-1])
        except ValueError as exc:
            raise ValueError(f"option {key!r} in {name!r} must be a number of seconds") from exc
        if options[key] < 0 or (options[key] == 0 and key != "reconnect_timeout"):
            raise ValueError(f"option {key!r} in {name!r} must be positive")
    return RemoteTarget(parts.netloc, **options)


class RemoteEnv(ChunkedEnv):
    """A batch of `num_envs` envs hosted by an EnvService server (one session per instance)."""

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> None:
        self._target = parse_remote_name(cfg.name)
        self._cfg = cfg
        self._env_offset = env_offset
        self._session = uuid.uuid4().hex
        self._seq = 0  # the last ChunkStep number sent in this session
        self.faults: Counter[str] = Counter()  # what the simulator got wrong and what it cost, by kind
        self._channel = make_channel(self._target.address)
        try:
            self._wait_ready()
            self._stub = env_pb2_grpc.EnvServiceStub(self._channel)
            reply = self._call("GetSpec", self._spec_request(num_envs))
            self._spec, self._task_list, self._obs_spec = self._checked_spec(reply, num_envs)
        except BaseException:
            self._channel.close()
            raise
        log.debug(
            "session %s on %s (%s): %d envs from index %d",
            self._session,
            self._target.address,
            reply.env_name or "?",
            num_envs,
            env_offset,
        )
        self._warn_ignored_settings()
        index = {t: i for i, t in enumerate(self._task_list)}
        self._task_ids = np.asarray([index.get(t, 0) for t in self._spec.task_names], np.int64)
        B = num_envs
        self._last_obs: dict | None = None  # the last finite observation of each env (stands in for a bad one)
        self._ep_return = np.zeros(B, np.float32)  # the episode in flight, to end it when the server cannot
        self._ep_length = np.zeros(B, np.int32)
        self._ep_success = np.zeros(B, bool)
        self._bad_streak = np.zeros(B, np.int32)
        self._scenes: list[int] | None = None  # the server's scene ids of the episodes the last Reset started
        self._recoveries_in_a_row = 0
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
                raise ValueError(
                    f"seeds must be {self._spec.num_envs} ints, got shape {seeds.shape} dtype {seeds.dtype}"
                )
            request.seeds.extend(int(s) for s in seeds)
        try:
            reply = self._call("Reset", request, reopen=True)
        except _Lost as exc:
            obs = self._reopen(str(exc), seeds)
        else:
            obs = self._checked_obs(reply.obs, reset=True)
            self._scenes = self._checked_scenes(reply)
        self._start_episodes(obs)
        return obs

    def episode_scenes(self) -> list[int] | None:
        """The scene ids the server's env gave for the episodes the last reset started (its
        `episode_scenes`), or None where it gives none."""
        return None if self._scenes is None else list(self._scenes)

    def chunk_step(self, actions: np.ndarray) -> StepResult:
        """As `ChunkedEnv.chunk_step`; shape/NaN errors in the actions come back from the server as
        ValueError. A lost session is reopened (every episode ends truncated); NaN/inf from the
        simulator ends that env's episode."""
        arr = np.asarray(actions)
        if arr.dtype != np.float32 and (arr.dtype.kind in "fiu"):
            arr = arr.astype(np.float32)  # local envs take any real actions too
        self._seq += 1
        request = env_pb2.ChunkStepRequest(
            session_id=self._session, actions=codec.encode_tensor("actions", arr), step_seq=self._seq
        )
        try:
            try:
                reply = self._call("ChunkStep", request, reopen=True)
            except ValueError:
                self._seq -= 1  # rejected for its input: not applied, the number is free again
                raise
            except TimeoutError:
                # the server may still apply the call that timed out: the retry carries the same
                # number, so it is answered from that step instead of stepping twice
                self.faults["step_timeouts"] += 1
                log.warning("env server %s: ChunkStep %d timed out; asking again", self._target.address, self._seq)
                try:
                    reply = self._call("ChunkStep", request, reopen=True)
                except TimeoutError as exc:
                    raise _Lost(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
            if reply.step_seq not in (0, self._seq):  # 0: a server that does not number steps
                raise _Lost(
                    grpc.StatusCode.FAILED_PRECONDITION, f"answered ChunkStep {reply.step_seq} to ChunkStep {self._seq}"
                )
        except _Lost as exc:
            return self._all_truncated(self._reopen(str(exc)))
        result = self._checked_step(reply)
        self._recoveries_in_a_row = 0
        return result

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
        raise TypeError(
            "a RemoteEnv holds a live gRPC channel and cannot be pickled: call make_env() in the "
            "process that steps it (env workers do)"
        )

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

    def _spec_request(self, num_envs: int) -> env_pb2.SpecRequest:
        return env_pb2.SpecRequest(
            session_id=self._session,
            num_envs=num_envs,
            env_offset=self._env_offset,
            seed=self._cfg.seed,
            chunk_size=self._cfg.chunk_size,
        )

    def _warn_ignored_settings(self) -> None:
        """The server decides the episode length and the task: say so when the recipe asks otherwise."""
        where, spec = self._target.address, self._spec
        if self._cfg.max_episode_steps != spec.max_episode_steps:
            _warn_once(
                "max_episode_steps",
                f"env.max_episode_steps={self._cfg.max_episode_steps} is ignored: the env "
                f"server {where} runs episodes of {spec.max_episode_steps} steps (set it on the server)",
            )
        wanted = [t.strip() for t in self._cfg.task.split(",") if t.strip()]
        if wanted and not set(wanted) <= set(self._task_list):
            _warn_once(
                "task",
                f"env.task={self._cfg.task!r} is ignored: the env server {where} runs "
                f"{', '.join(self._task_list)} (set the task on the server)",
            )

    def _call(self, rpc: str, request, reopen: bool = False):
        """One unary call with the deadline; gRPC statuses become the errors a local env would raise
        (with `reopen`, those that a reopened session may cure raise `_Lost` instead)."""
        t = self._target
        try:
            return getattr(self._stub, rpc)(request, timeout=t.timeout)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
            if reopen and t.reconnect_timeout > 0 and code in _REOPEN:
                raise _Lost(code, details or "") from None
            where = f"env server {t.address} ({rpc})"
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(f"{where}: {details}") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise ConnectionError(f"{where} unreachable: {details}") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"{where} did not answer within {t.timeout:g}s") from None
            raise RemoteEnvError(f"{where}: {code.name}: {details}") from None

    def _reopen(self, why: str, seeds: np.ndarray | None = None) -> dict:
        """A new session with the same settings, waiting up to `reconnect_timeout` for the server;
        returns its first observation. The old session is abandoned (a server that still holds it
        frees it when it is idle or on Close)."""
        t = self._target
        self._recoveries_in_a_row += 1
        if self._recoveries_in_a_row > MAX_RECOVERIES_IN_A_ROW:
            raise RemoteEnvError(
                f"env server {t.address}: the session failed {MAX_RECOVERIES_IN_A_ROW} times in a "
                f"row with no good step in between (last: {why}); giving up"
            )
        self.faults["reopened_sessions"] += 1
        log.warning("env server %s: %s; reopening the session (episodes in flight end as truncated)", t.address, why)
        old, deadline = self._session, time.monotonic() + t.reconnect_timeout
        self._session, self._seq = uuid.uuid4().hex, 0
        last = why
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionError(
                    f"env server {t.address} did not come back within {t.reconnect_timeout:g}s "
                    f"(reconnect_timeout); last error: {last}"
                )
            # a fresh channel each try skips gRPC's growing reconnect backoff
            self._channel.close()
            self._channel = make_channel(t.address)
            self._stub = env_pb2_grpc.EnvServiceStub(self._channel)
            ready = grpc.channel_ready_future(self._channel)
            try:
                ready.result(timeout=min(left, 5.0))
                spec, _, obs_spec = self._checked_spec(
                    self._stub.GetSpec(self._spec_request(self._spec.num_envs), timeout=min(left, t.timeout)),
                    self._spec.num_envs,
                )
                if (spec, obs_spec) != (self._spec, self._obs_spec):
                    raise RemoteEnvError(
                        f"env server {t.address} came back with other envs: {spec} {obs_spec}, "
                        f"was {self._spec} {self._obs_spec}"
                    )
                request = env_pb2.ResetRequest(session_id=self._session)
                if seeds is not None:
                    request.seeds.extend(int(s) for s in seeds)
                reply = self._stub.Reset(request, timeout=min(left, t.timeout))
                obs = self._checked_obs(reply.obs, reset=True)
                self._scenes = self._checked_scenes(reply)
                break
            except grpc.FutureTimeoutError:
                ready.cancel()
                last = "no connection"
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        try:
            self._stub.Close(env_pb2.CloseRequest(session_id=old), timeout=1.0)
        except grpc.RpcError:
            pass  # a restarted server never had it
        log.warning("env server %s: session reopened", t.address)
        return obs

    def _checked_scenes(self, reply: env_pb2.StepReply) -> list[int] | None:
        scenes = list(reply.episode_scenes)
        if scenes and len(scenes) != self._spec.num_envs:
            raise codec.WireFormatError(
                f"Reset gave {len(scenes)} episode_scenes for {self._spec.num_envs} envs (send one per env, or none)"
            )
        return scenes or None

    def _start_episodes(self, obs: dict) -> None:
        self._last_obs = {k: v.copy() for k, v in obs.items() if isinstance(v, np.ndarray)}
        self._ep_return[:] = 0
        self._ep_length[:] = 0
        self._ep_success[:] = False
        self._bad_streak[:] = 0

    def _all_truncated(self, obs: dict) -> StepResult:
        """The step after a reopened session: every episode in flight ended (truncated, nothing earned)."""
        B, K = self._spec.num_envs, self._spec.chunk_size
        self.faults["episodes_truncated"] += B
        final = dict(self._last_obs or {})
        result = StepResult(
            obs=obs,
            rewards=np.zeros((B, K), np.float32),
            terminated=np.zeros(B, bool),
            truncated=np.ones(B, bool),
            success=np.zeros(B, bool),
            episode_done=np.ones(B, bool),
            episode_return=self._ep_return.copy(),
            episode_length=self._ep_length.copy(),
            episode_success_once=self._ep_success.copy(),
            final_obs={
                k: final.get(k, np.zeros_like(v))
                for k, v in obs.items()
                if isinstance(v, np.ndarray) and k != "task_ids"
            },
            substeps=np.zeros(B, np.int32),  # the lost session's chunk: no simulated step came back
        )
        self._start_episodes(obs)
        return result

    def _checked_step(self, reply: env_pb2.StepReply) -> StepResult:
        """Decode a ChunkStep reply; an env with NaN/inf in its reward or observation ends its episode."""
        B, K = self._spec.num_envs, self._spec.chunk_size
        obs = self._checked_obs(reply.obs, reset=False)
        try:
            fields, final_obs = decode_step(reply.step, B, K, finite=False)
        except codec.WireFormatError as exc:
            raise RemoteEnvError(f"env server {self._target.address} sent a bad step result: {exc}") from exc
        final_obs = self._checked_final(final_obs, obs)
        if "substeps" not in fields:  # a server that does not say: a finished episode's length tells
            ran = np.where(fields["episode_done"], fields["episode_length"] - self._ep_length, K)
            fields["substeps"] = np.clip(ran, 0, K).astype(np.int32)
        bad = np.zeros(B, bool)
        for name in ("rewards", "episode_return"):
            rows = ~np.isfinite(fields[name].reshape(B, -1)).all(axis=1)
            if name == "episode_return":
                rows &= fields["episode_done"]
            self._count_bad(name, rows)
            bad |= rows
        bad_obs = np.zeros(B, bool)
        for key, value in obs.items():
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                rows = ~np.isfinite(value.reshape(B, -1)).all(axis=1)
                self._count_bad(key, rows)
                bad_obs |= rows
                if key in final_obs:
                    frows = ~np.isfinite(final_obs[key].reshape(B, -1)).all(axis=1) & fields["episode_done"]
                    self._count_bad("final_" + key, frows)
                    bad |= frows
        bad |= bad_obs
        if bad.any():
            self._end_bad_episodes(bad, bad_obs, fields, obs, final_obs)
        self._bad_streak = np.where(bad_obs, self._bad_streak + 1, 0)
        done = fields["episode_done"]
        # episodes in flight, to end them ourselves if the server is lost
        self._ep_return = np.where(done, 0, self._ep_return + fields["rewards"].sum(axis=1)).astype(np.float32)
        self._ep_length = np.where(done, 0, self._ep_length + K).astype(np.int32)
        self._ep_success = np.where(done, False, self._ep_success | fields["success"])
        for key, value in self._last_obs.items():
            value[:] = obs[key]
        result = StepResult(obs=obs, final_obs=final_obs, **fields)
        if (self._bad_streak >= MAX_BAD_OBS_STREAK).any():  # the simulator stays broken: start it over
            stuck = np.flatnonzero(self._bad_streak >= MAX_BAD_OBS_STREAK).tolist()
            self.faults["session_resets"] += 1
            log.warning(
                "env server %s: envs %s sent NaN/inf observations %d chunks in a row; resetting the session",
                self._target.address,
                stuck,
                MAX_BAD_OBS_STREAK,
            )
            fresh = self._call("Reset", env_pb2.ResetRequest(session_id=self._session))
            new_obs = self._checked_obs(fresh.obs, reset=True)
            # this chunk's finished episodes keep their stats; the others end here, truncated
            open_ = ~result.episode_done
            result.truncated |= open_
            result.episode_return = np.where(open_, self._ep_return, result.episode_return).astype(np.float32)
            result.episode_length = np.where(open_, self._ep_length, result.episode_length).astype(np.int32)
            result.episode_success_once = np.where(open_, self._ep_success, result.episode_success_once)
            for key, value in result.final_obs.items():
                value[open_] = obs[key][open_]
            result.episode_done[:] = True
            result.obs = new_obs
            self.faults["episodes_truncated"] += int(open_.sum())
            self._start_episodes(new_obs)
        return result

    def _count_bad(self, name: str, rows: np.ndarray) -> None:
        if rows.any():
            self.faults[f"non_finite_{name}"] += int(rows.sum())
            log.warning(
                "env server %s sent NaN/inf %s for envs %s: the simulator's fault; those episodes end (truncated)",
                self._target.address,
                name,
                np.flatnonzero(rows).tolist(),
            )

    def _end_bad_episodes(self, bad: np.ndarray, bad_obs: np.ndarray, fields: dict, obs: dict, final_obs: dict) -> None:
        """End each bad env's episode as truncated with nothing earned in this chunk; a NaN/inf
        observation is replaced by that env's last good one, so the policy never sees it."""
        self.faults["episodes_ended_bad_reply"] += int(bad.sum())
        last = self._last_obs or {}
        for key, value in obs.items():
            if isinstance(value, np.ndarray) and key in last:
                if key in final_obs:
                    final_obs[key][bad & ~fields["episode_done"]] = last[key][bad & ~fields["episode_done"]]
                    fin_bad = bad & fields["episode_done"]
                    if value.dtype.kind == "f":
                        fin_rows = ~np.isfinite(final_obs[key].reshape(len(bad), -1)).all(axis=1) & fin_bad
                        final_obs[key][fin_rows] = last[key][fin_rows]
                value[bad_obs] = last[key][bad_obs]
        open_ = bad & ~fields["episode_done"]
        fields["episode_return"] = np.where(
            open_, self._ep_return, np.nan_to_num(fields["episode_return"], nan=0.0, posinf=0.0, neginf=0.0)
        ).astype(np.float32)
        fields["episode_length"] = np.where(open_, self._ep_length, fields["episode_length"]).astype(np.int32)
        fields["episode_success_once"] = np.where(open_, self._ep_success, fields["episode_success_once"])
        fields["rewards"][bad] = 0.0
        fields["truncated"][bad] |= ~fields["terminated"][bad]
        fields["success"][bad] &= fields["episode_done"][bad]
        fields["episode_done"][bad] = True

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
        if self._cfg.wrist_camera and obs_spec.get("wrist_images") != ((size, size, 3), "uint8"):
            have = obs_spec.get("wrist_images", "none")
            raise ValueError(
                f"env.wrist_camera is set but env server {self._target.address} sends wrist_images {have}: "
                f"start it with wrist_camera=true and image_size={size}, or set env.wrist_camera=false"
            )
        return spec, task_list, obs_spec

    def _checked_obs(self, msg, reset: bool) -> dict:
        """Decoded observations, checked against the spec (NaN/inf too after a Reset; a step's are
        checked per env by `_checked_step`), with derivable keys filled in."""
        B = self._spec.num_envs
        try:
            obs = decode_obs(msg)
            for key, (shape, dtype) in self._obs_spec.items():
                codec.require(obs, key, dtype, (B, *shape), finite=reset)
            if "task_ids" in obs:
                codec.require(obs, "task_ids", "int64", (B,))
                if ((obs["task_ids"] < 0) | (obs["task_ids"] >= len(self._task_list))).any():
                    raise codec.WireFormatError(
                        f"task_ids {obs['task_ids'].tolist()} outside the {len(self._task_list)} tasks of the spec",
                        reason="bad_value",
                    )
        except codec.WireFormatError as exc:
            raise RemoteEnvError(
                f"env server {self._target.address} sent a bad observation (the simulator's "
                f"fault, not the policy's): {exc}"
            ) from exc
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
                    raise RemoteEnvError(
                        f"env server {self._target.address}: final_{key} is "
                        f"{final_obs[key].dtype}{list(final_obs[key].shape)}, obs {key} is "
                        f"{value.dtype}{list(value.shape)}"
                    )
                out[key] = final_obs[key]
            elif key == "instructions":
                out[key] = value.copy()
            else:
                raise RemoteEnvError(
                    f"env server {self._target.address} sent no final_{key} "
                    "(the observation finished episodes ended in)"
                )
        return out
