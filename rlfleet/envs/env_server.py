"""EnvService: any registered env served over gRPC, so actors on other hosts (or in other
languages) can step it as `env.name=remote://HOST:PORT`.

The server hosts one env batch per client session (an actor's env workers each open their own,
sized and offset like the local env they replace). Bad input is answered with a clear gRPC
status and counted; it never takes the server down or corrupts a session.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import logging
import threading
import time
from argparse import Namespace
from collections import Counter
from dataclasses import dataclass, field

import grpc
import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlfleet.envs.api import ChunkedEnv, EnvConfig, observation_spec
from rlfleet.envs.env_messages import reset_reply, spec_reply, step_reply
from rlfleet.envs.registry import build_env_config, env_config_class, make_env
from rlfleet.telemetry.prometheus import EnvServerCollector, MetricsPortError, start_role_metrics
from rlfleet.wire import codec
from rlfleet.wire.gen import env_pb2, env_pb2_grpc
from rlfleet.wire.grpc_decoding import add_servicer
from rlfleet.wire.grpc_server import start_grpc_server
from rlfleet.wire.join import stop_on_signals, write_address
from rlfleet.wire.rejections import RejectionCounter

log = logging.getLogger(__name__)
SERVICE_NAME = "rlfleet.v1.EnvService"


@dataclass
class EnvServerConfig:
    """What to serve and how much of it: sessions are bounded so a leaking client cannot eat the host."""

    env: EnvConfig = field(default_factory=EnvConfig)
    num_envs: int = 1  # batch size of a session whose client does not ask for one
    max_envs: int = 256  # envs across all sessions; more is RESOURCE_EXHAUSTED
    session_idle_s: float = 600.0  # a session idle this long is closed when another needs its room
    host: str = "127.0.0.1"
    port: int = 0


class RequestError(Exception):
    """A call rejected with a gRPC status; the server and the session stay as they were."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.reason = code.name.lower()


def _libc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _libc_trim()


def release_memory() -> None:
    """After closing envs: simulators leave reference cycles (and glibc keeps freed arenas), which
    grew the server by tens of MB per session opened and closed; collect them and hand the pages back."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


@dataclass
class _Session:
    env: ChunkedEnv
    settings: tuple[int, int, int, int]  # (num_envs, env_offset, seed, chunk_size)
    lock: threading.Lock = field(default_factory=threading.Lock)
    was_reset: bool = False
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False
    last_seq: int = 0  # the last numbered ChunkStep applied, and its reply (a retry gets it again)
    last_reply: env_pb2.StepReply | None = None


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    """One env batch per session id, made through the registry from the server's EnvConfig."""

    def __init__(self, cfg: EnvServerConfig):
        self.cfg = cfg
        self.sessions: dict[str, _Session] = {}
        self.errors: Counter[str] = Counter()  # rejected calls by status code name
        self.rejections = RejectionCounter()  # the same calls by reason (undecodable, bad_shape, ...)
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()  # the session table only: envs are built and closed outside it
        self._reserved = 0  # envs of sessions being built right now, counted against max_envs

    # --- RPCs -------------------------------------------------------------------------------

    def GetSpec(self, request: env_pb2.SpecRequest, context: grpc.ServicerContext) -> env_pb2.EnvSpecReply:
        return self._serve("GetSpec", context, lambda: self._open(request))

    def Reset(self, request: env_pb2.ResetRequest, context: grpc.ServicerContext) -> env_pb2.StepReply:
        return self._serve("Reset", context, lambda: self._reset(request))

    def ChunkStep(self, request: env_pb2.ChunkStepRequest, context: grpc.ServicerContext) -> env_pb2.StepReply:
        return self._serve("ChunkStep", context, lambda: self._step(request))

    def Close(self, request: env_pb2.CloseRequest, context: grpc.ServicerContext) -> env_pb2.CloseReply:
        return self._serve("Close", context, lambda: self._close_session(request.session_id))

    # --- implementation ---------------------------------------------------------------------

    def _serve(self, rpc: str, context: grpc.ServicerContext, handler):
        self.calls[rpc] += 1
        try:
            return handler()
        except RequestError as exc:
            self._reject(rpc, context, exc.code, str(exc), exc.reason)
        except (codec.WireFormatError, ValueError) as exc:  # the env's own input checks
            self._reject(rpc, context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), getattr(exc, "reason", "bad_value"))
        except Exception as exc:  # a simulator failure: report it, keep serving
            log.exception("%s failed", rpc)
            self._reject(rpc, context, grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}", "simulator_error")

    def count_undecodable(self, reason: str) -> None:
        """A request whose bytes are no message (`rlfleet.wire.grpc_decoding`): INVALID_ARGUMENT, counted."""
        self.errors[grpc.StatusCode.INVALID_ARGUMENT.name] += 1
        self.rejections.count(reason)

    def _reject(
        self, rpc: str, context: grpc.ServicerContext, code: grpc.StatusCode, message: str, reason: str
    ) -> None:
        self.errors[code.name] += 1
        self.rejections.count(reason)
        log.warning("rejected %s (%s): %s", rpc, code.name, message)
        context.abort(code, message)

    def _open(self, request: env_pb2.SpecRequest) -> env_pb2.EnvSpecReply:
        n = request.num_envs or self.cfg.num_envs
        k = request.chunk_size or self.cfg.env.chunk_size
        if n < 1 or request.env_offset < 0 or k < 1:
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"num_envs and chunk_size must be >= 0 and env_offset >= 0, got "
                f"{request.num_envs}, {request.chunk_size}, {request.env_offset}",
            )
        if request.seed < 0:  # seeds feed numpy's SeedSequence, which takes none below 0: every Reset would fail
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"seed must be >= 0, got {request.seed}")
        settings = (n, int(request.env_offset), int(request.seed), k)
        with self._lock:
            old = self.sessions.get(request.session_id)
            if old is not None and old.settings == settings:
                old.last_used = time.monotonic()
                return self._describe(old.env)
            retired = self._make_room(n, replacing=old)
            self._reserved += n
        self._close_envs(retired)
        try:  # built outside the table's lock: a slow simulator start does not stall other sessions
            env_cfg = dataclasses.replace(self.cfg.env, seed=settings[2], chunk_size=k)
            env = make_env(env_cfg, n, env_offset=settings[1])
        finally:
            with self._lock:
                self._reserved -= n
        with self._lock:
            old = self.sessions.pop(request.session_id, None)  # the one replaced (or a racing open's)
            self.sessions[request.session_id] = _Session(env, settings)
        self._close_envs([old] if old is not None else [])
        log.info(
            "session %r: %d envs from index %d, seed %d, chunk %d (%d sessions)",
            request.session_id,
            n,
            settings[1],
            settings[2],
            k,
            len(self.sessions),
        )
        return self._describe(env)

    def _describe(self, env: ChunkedEnv) -> env_pb2.EnvSpecReply:
        obs_spec = observation_spec(self.cfg.env, env.spec.state_dim)
        return spec_reply(env.spec, env.task_list, obs_spec, self.cfg.env.name)

    def _make_room(self, n: int, replacing: _Session | None) -> list[_Session]:
        """Take idle sessions out of the table until n more envs fit under max_envs (caller holds
        the lock); returns them for `_close_envs` once the lock is released."""

        def in_use() -> int:
            return self._reserved + sum(s.settings[0] for s in self.sessions.values() if s is not replacing)

        retired: list[_Session] = []
        if in_use() + n <= self.cfg.max_envs:
            return retired
        now = time.monotonic()
        for sid, s in sorted(self.sessions.items(), key=lambda kv: kv[1].last_used):
            if s is not replacing and now - s.last_used > self.cfg.session_idle_s:
                log.info("closing session %r, idle for %.0fs", sid, now - s.last_used)
                retired.append(self.sessions.pop(sid))
                if in_use() + n <= self.cfg.max_envs:
                    return retired
        self._close_envs(retired)  # idle past the limit either way (under the lock: rare)
        raise RequestError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{n} more envs would exceed this server's limit of {self.cfg.max_envs} "
            f"({in_use()} in use by {len(self.sessions)} sessions); close sessions or raise --max-envs",
        )

    def _close_envs(self, sessions: list[_Session]) -> None:
        """Close sessions already out of the table (no lock held: closing a simulator takes a while)."""
        for session in sessions:
            with session.lock:  # let a call in flight finish first
                session.closed = True
                session.env.close()
        if sessions:
            release_memory()

    def _session(self, sid: str) -> _Session:
        with self._lock:
            session = self.sessions.get(sid)
        if session is None:
            raise RequestError(
                grpc.StatusCode.FAILED_PRECONDITION, f"no open session {sid!r}: call GetSpec with this session_id first"
            )
        session.last_used = time.monotonic()
        return session

    def _reset(self, request: env_pb2.ResetRequest) -> env_pb2.StepReply:
        session = self._session(request.session_id)
        n = session.settings[0]
        seeds = np.asarray(request.seeds, dtype=np.int64) if len(request.seeds) else None
        if seeds is not None and seeds.shape != (n,):
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"got {len(request.seeds)} seeds for a session of {n} envs (send {n}, or none)",
            )
        with session.lock:
            self._check_open(session, request.session_id)
            obs = session.env.reset(seeds)
            scenes = session.env.episode_scenes()
            session.was_reset = True
        return reset_reply(obs, scenes)

    def _step(self, request: env_pb2.ChunkStepRequest) -> env_pb2.StepReply:
        session = self._session(request.session_id)
        spec = session.env.spec
        if not request.HasField("actions"):
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "ChunkStep needs an `actions` tensor")
        actions = codec.decode_tensor(request.actions)
        actions = codec.require(
            {"actions": actions}, "actions", "float32", (spec.num_envs, spec.chunk_size, spec.action_dim), finite=True
        )
        seq = int(request.step_seq)
        with session.lock:
            self._check_open(session, request.session_id)
            if not session.was_reset:
                raise RequestError(
                    grpc.StatusCode.FAILED_PRECONDITION, f"session {request.session_id!r}: call Reset before ChunkStep"
                )
            if seq and seq == session.last_seq and session.last_reply is not None:
                self.calls["ChunkStep_repeated"] += 1  # a retry after a time-out: answered, not stepped again
                return session.last_reply
            if seq and seq != session.last_seq + 1:
                raise RequestError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"session {request.session_id!r}: step_seq {seq}, expected {session.last_seq + 1} "
                    f"(a ChunkStep was lost or repeated)",
                )
            reply = step_reply(session.env.chunk_step(actions))
            reply.step_seq = seq
            if seq:
                session.last_seq, session.last_reply = seq, reply
        return reply

    @staticmethod
    def _check_open(session: _Session, sid: str) -> None:
        if session.closed:
            raise RequestError(grpc.StatusCode.FAILED_PRECONDITION, f"session {sid!r} was closed")

    def _close_session(self, sid: str) -> env_pb2.CloseReply:
        with self._lock:
            session = self.sessions.pop(sid, None)
        self._close_envs([session] if session is not None else [])
        return env_pb2.CloseReply()

    def close(self) -> None:
        """Close every session's envs (server shutdown)."""
        with self._lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        self._close_envs(sessions)


def check_env_config(cfg: EnvServerConfig) -> None:
    """Build (and close) one env so a bad config fails at start-up, not at the first client."""
    if cfg.num_envs < 1 or cfg.max_envs < cfg.num_envs:
        raise ValueError(f"need 1 <= num_envs <= max_envs, got {cfg.num_envs} and {cfg.max_envs}")
    make_env(cfg.env, 1).close()


def serve_env(cfg: EnvServerConfig) -> tuple[grpc.Server, int, EnvServicer]:
    """Start EnvService (with health and reflection) for `cfg.env`; returns (server, bound port, servicer)."""
    check_env_config(cfg)
    servicer = EnvServicer(cfg)
    server, port = start_grpc_server(
        cfg.host,
        cfg.port,
        [
            lambda s: add_servicer(
                env_pb2_grpc.add_EnvServiceServicer_to_server, servicer, s, servicer.count_undecodable
            )
        ],
        [SERVICE_NAME],
    )
    return server, port, servicer


def env_config(name: str, task: str | None = None, overrides: list[str] | None = None) -> EnvConfig:
    """The env's settings (its family's EnvConfig class) from `--env`, `--task` and `key=value`
    overrides, type-checked like recipe overrides."""
    bad = [o for o in overrides or [] if "=" not in o]
    if bad:
        raise ValueError(f"env overrides must look like key=value (EnvConfig fields), got {bad}")
    try:
        schema = OmegaConf.structured(env_config_class(name))
        cfg = OmegaConf.merge(schema, OmegaConf.from_dotlist(list(overrides or [])))
    except OmegaConfBaseException as exc:
        raise ValueError(f"bad env override: {exc}".splitlines()[0]) from exc
    cfg.name = name
    if task:
        cfg.task = task
    return build_env_config(OmegaConf.to_container(cfg))  # type: ignore[arg-type]


def main(args: Namespace) -> int:
    """`rlfleet env-server --env NAME`: serve a registered simulator over gRPC (EnvService), for
    `env.name=remote://HOST:PORT`, until SIGINT / SIGTERM."""
    cfg = EnvServerConfig(
        env=env_config(args.env, args.task, args.overrides),
        num_envs=args.num_envs,
        max_envs=args.max_envs,
        host=args.host,
        port=args.port,
    )
    server, port, servicer = serve_env(cfg)
    address = f"{args.host}:{port}"
    try:
        metrics = start_role_metrics("env-server", args.metrics_port, [EnvServerCollector(servicer)], args.metrics_host)
    except MetricsPortError:  # a taken port stops the gRPC server first
        server.stop(grace=0)
        raise
    write_address(args.address_file, env=address)
    what = f"{cfg.env.name} ({cfg.env.task})" if cfg.env.task else cfg.env.name
    log.info("EnvService for %s on %s: use env.name=remote://%s", what, address, address)
    stop = threading.Event()
    stop_on_signals(stop)
    stop.wait()
    server.stop(grace=2.0).wait()
    servicer.close()
    if metrics is not None:
        metrics.close()
    log.info("env server stopped: calls %s, rejected %s", dict(servicer.calls), dict(servicer.errors) or "none")
    return 0
