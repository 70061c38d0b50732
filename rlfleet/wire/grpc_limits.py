"""Long-lived gRPC streams get their own budget, so they cannot starve every other call.

gRPC's Python server runs each call on a worker thread for as long as the call lasts. An idle
Act, PushTrajectory, WatchWeights, PullWeights or Credits stream (a paced actor holds one Credits
stream for its whole life) therefore holds a thread; with one shared pool, a
few dozen idle streams left no thread for health checks, Act or Push. `StreamBudget` (a server
interceptor) admits at most `max_streams` streaming calls at once, refusing more with
RESOURCE_EXHAUSTED, and the pool is sized to those plus the server's own workers
(`start_grpc_server(max_workers=32)`), so unary calls always find a thread. A request stream that
sends nothing for `idle_s` while the server waits on it is
cancelled; HTTP/2 keepalive pings find peers that vanished without closing their connection.

Streams of the methods anyone may call without a token (health `Watch`, reflection) draw on a
separate small budget, `max_open_streams`: with a token set, a stranger can hold at most that
many streams, and none of the budget authenticated work (Act, PushTrajectory, WatchWeights,
PullWeights, Credits) needs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import grpc

log = logging.getLogger(__name__)
# methods served without a token (rlfleet.wire.auth lets health checks through): their own budget
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class StreamLimits:
    max_streams: int = 256  # streaming calls at once (RLFLEET_GRPC_MAX_STREAMS)
    # streams of health and reflection methods, callable without a token (RLFLEET_GRPC_MAX_OPEN_STREAMS)
    max_open_streams: int = 16
    # a request stream silent this long is cancelled (RLFLEET_GRPC_STREAM_IDLE_S); long, because an
    # actor legitimately goes quiet on its Act stream while it waits out a slow learner update
    idle_s: float = 3600.0
    keepalive_s: float = 60.0  # HTTP/2 ping interval on every connection
    keepalive_timeout_s: float = 20.0  # a ping unanswered this long closes the connection

    @classmethod
    def from_env(cls) -> StreamLimits:
        return cls(
            max_streams=int(_env_float("RLFLEET_GRPC_MAX_STREAMS", cls.max_streams)),
            max_open_streams=int(_env_float("RLFLEET_GRPC_MAX_OPEN_STREAMS", cls.max_open_streams)),
            idle_s=_env_float("RLFLEET_GRPC_STREAM_IDLE_S", cls.idle_s),
        )

    def options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
            ("grpc.http2.max_ping_strikes", 0),
        ]


class _Reaper:
    """One daemon thread for every server in the process, checking their silent streams."""

    _budgets: weakref.WeakSet[StreamBudget] = weakref.WeakSet()  # noqa: RUF012  (shared by design)
    _lock = threading.Lock()
    _thread: threading.Thread | None = None

    @classmethod
    def add(cls, budget: StreamBudget) -> None:
        with cls._lock:
            cls._budgets.add(budget)
            if cls._thread is None:
                cls._thread = threading.Thread(target=cls._run, name="grpc-stream-reaper", daemon=True)
                cls._thread.start()

    @classmethod
    def _run(cls) -> None:
        while True:
            with cls._lock:
                budgets = list(cls._budgets)
            period = min([1.0, *(b.limits.idle_s / 4 for b in budgets)])
            for b in budgets:
                b.reap()
            del budgets
            time.sleep(max(0.05, period))


class StreamBudget(grpc.ServerInterceptor):
    """Admits streaming calls up to the budget and cancels request streams that went silent."""

    def __init__(
        self,
        limits: StreamLimits,
        on_refused: Callable[[str], None] | None = None,
        identify: Callable[[object], str] | None = None,
        identities: int = 1,
    ):
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.max_streams)
        # With several token identities, each may hold its share of the budget and no more, so one
        # cannot take the streams another needs. `identify(metadata)` names a call's identity.
        self._identify = identify if identities > 1 else None
        self.identity_share = max(1, limits.max_streams // identities) if identities > 1 else limits.max_streams
        self._held: dict[str, int] = {}
        self._open_slots = threading.BoundedSemaphore(max(limits.max_open_streams, 1))
        self._on_refused = on_refused or (lambda reason: None)
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[float, grpc.ServicerContext]] = {}
        self.open_streams = 0
        self.refused = 0  # streams refused: budget spent
        self.idle_closed = 0  # streams cancelled for silence
        _Reaper.add(self)

    # ---- idle request streams ------------------------------------------------------------
    def reap(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [(k, ctx) for k, (since, ctx) in self._waiting.items() if now - since > self.limits.idle_s]
            for k, _ in stale:
                self._waiting.pop(k, None)
        for _, ctx in stale:
            self.idle_closed += 1
            self._on_refused("stream_idle")
            log.warning("closing a gRPC stream idle for more than %.0f s", self.limits.idle_s)
            ctx.cancel()

    def _watched(self, requests, context):
        key = id(object())
        for_next = iter(requests)
        while True:
            with self._lock:
                self._waiting[key] = (time.monotonic(), context)
            try:
                msg = next(for_next)
            except StopIteration:
                return
            finally:
                with self._lock:
                    self._waiting.pop(key, None)
            yield msg

    # ---- the budget ----------------------------------------------------------------------
    def _admit(self, context, open_method: bool, who: str) -> None:
        if who:
            with self._lock:
                over = self._held.get(who, 0) >= self.identity_share
                if not over:
                    self._held[who] = self._held.get(who, 0) + 1
            if over:
                self.refused += 1
                self._on_refused("identity_streams")
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"identity {who!r} holds its {self.identity_share} streams: try again later",
                )
        slots = self._open_slots if open_method else self._slots
        if not slots.acquire(blocking=False):
            self._leave_identity(who)
            self.refused += 1
            self._on_refused("too_many_open_streams" if open_method else "too_many_streams")
            most = max(self.limits.max_open_streams, 1) if open_method else self.limits.max_streams
            what = "health/reflection streams" if open_method else "streams"
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"server has {most} {what} open: try again later")
        with self._lock:
            self.open_streams += 1

    def _leave_identity(self, who: str) -> None:
        if who:
            with self._lock:
                left = self._held.get(who, 0) - 1
                if left > 0:
                    self._held[who] = left
                else:
                    self._held.pop(who, None)

    def _leave(self, open_method: bool, who: str) -> None:
        self._leave_identity(who)
        with self._lock:
            self.open_streams -= 1
        (self._open_slots if open_method else self._slots).release()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        kind = (
            ("stream" if handler.request_streaming else "unary")
            + "_"
            + ("stream" if handler.response_streaming else "unary")
        )
        behavior = getattr(handler, kind)
        watch = handler.request_streaming
        open_method = handler_call_details.method.startswith(OPEN_METHOD_PREFIXES)
        identify = self._identify
        who = "" if open_method or identify is None else identify(handler_call_details.invocation_metadata)

        if handler.response_streaming:

            def call(request, context):
                self._admit(context, open_method, who)
                try:
                    yield from behavior(self._watched(request, context) if watch else request, context)
                finally:
                    self._leave(open_method, who)
        else:

            def call(request, context):
                self._admit(context, open_method, who)
                try:
                    return behavior(self._watched(request, context) if watch else request, context)
                finally:
                    self._leave(open_method, who)

        return handler._replace(**{kind: call})


def peer_host(peer: str) -> str:
    """The host part of a gRPC peer string ('ipv4:1.2.3.4:5', 'ipv6:[::1]:5', 'unix:/p')."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return rest.rsplit(":", 1)[0]
    return peer


class PeerRate:
    """A token bucket per peer host: `burst` at once, then `per_s` a second (callers count refusals).

    Bounds what one host can add to a table whose entries are forgotten after `forget_s`: at most
    `burst + per_s * forget_s` live entries per host. The buckets themselves are bounded
    (`max_peers`, least recently used dropped, which only gives that host a full bucket back).
    """

    def __init__(self, burst: int, per_s: float, max_peers: int = 1024):
        self.burst, self.per_s, self.max_peers = burst, per_s, max_peers
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # host -> (tokens, at)
        self._lock = threading.Lock()

    def allow(self, host: str) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.pop(host, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.per_s)
            ok = tokens >= 1.0
            self._buckets[host] = (tokens - 1.0 if ok else tokens, now)
            while len(self._buckets) > self.max_peers:
                self._buckets.popitem(last=False)
            return ok
