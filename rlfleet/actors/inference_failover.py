"""An actor's inference over several servers: requests spread round-robin, failover, re-probing.

`rlfleet actor --inference host1:port1,host2:port2` gives an actor several inference servers.
Each request (one pipeline stage's rows) goes to the next live server in turn, so with two
stages and two servers each env half has its own server. When a server fails (its gRPC stream
breaks, its ZeroMQ connection drops, or an answer misses `request_timeout_s`) it is marked
down and every request it still owed is sent again to a live server. The envs of a stage only
step once its answer has arrived, so the retried request carries the same observation: no env
step is lost or taken twice, and a late answer from the failed server dies with its closed
connection. Downed servers are health-checked every `probe_interval_s` and used again once
they answer SERVING. With every server down for `all_down_timeout_s` the actor stops with an
error that names them.

Transport shm lets the server write answers straight into the actor's shared rows. A server
that missed its deadline but is still alive could then write there late, after the request
moved to another server, so with several addresses shm is served over zmq (raw frames) instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import zmq
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.actors.inference_client import InferenceError, InferenceUnavailable, StopWaiting, connect_inference
from rlfleet.config import InferenceFailoverConfig
from rlfleet.wire.grpc_server import make_channel
from rlfleet.wire.shm import SharedArrays

log = logging.getLogger(__name__)
SERVICE = "rlfleet.v1.InferenceService"


def parse_addresses(addresses: str | Sequence[str]) -> list[str]:
    """`"h1:p1,h2:p2"` (or a list of such strings) -> ["h1:p1", "h2:p2"], order kept, no repeats."""
    items = [addresses] if isinstance(addresses, str) else list(addresses)
    out: list[str] = []
    for item in items:
        for addr in item.split(","):
            addr = addr.strip()
            if addr and addr not in out:
                out.append(addr)
    if not out:
        raise ValueError("no inference server address given")
    return out


def probe_health(address: str, timeout_s: float = 2.0) -> bool:
    """True when the server's standard gRPC health check answers SERVING for the inference service."""
    try:
        with make_channel(address) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout_s
            )
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


@dataclass
class _Server:
    address: str
    client: object | None = None  # None while the server is down
    next_probe: float = 0.0


@dataclass
class _Request:
    lo: int
    hi: int
    deterministic: bool
    server: _Server | None = None
    client: object | None = None  # the connection it was sent on; gone or replaced: resend


class FailoverInferenceClient:
    """The submit/wait interface of one inference client, over several servers."""

    def __init__(
        self,
        transport: str,
        addresses: Sequence[str],
        slots: SharedArrays,
        actor_id: str = "",
        should_stop: Callable[[], bool] = lambda: False,
        settings: InferenceFailoverConfig | None = None,
        connect: Callable = connect_inference,
        probe: Callable[[str, float], bool] = probe_health,
    ):
        self.settings = settings or InferenceFailoverConfig()
        self.transport = transport
        if transport == "shm" and len(addresses) > 1:
            log.warning(
                "transport shm with %d inference servers: using zmq so that a server that is "
                "failed over from can never write into this actor's rows late",
                len(addresses),
            )
            self.transport = "zmq"
        self.slots, self.actor_id, self.should_stop = slots, actor_id, should_stop
        self._connect, self._probe = connect, probe
        self.servers = [_Server(a) for a in addresses]
        self._pending: dict[int, _Request] = {}
        self._turn = 0
        self._all_down_since: float | None = time.monotonic()
        self.failovers = 0  # times a server was marked down
        self.retried = 0  # requests sent again after their server failed
        for server in self.servers:
            self._try_connect(server)

    # ---- servers ----------------------------------------------------------------------------
    def live(self) -> list[str]:
        return [s.address for s in self.servers if s.client is not None]

    def _try_connect(self, server: _Server) -> bool:
        server.next_probe = time.monotonic() + self.settings.probe_interval_s
        if not self._probe(server.address, min(2.0, self.settings.request_timeout_s)):
            return False
        try:
            server.client = self._connect(
                self.transport,
                server.address,
                self.slots,
                self.actor_id,
                self.should_stop,
                self.settings.request_timeout_s,
            )
        except (InferenceUnavailable, grpc.RpcError, zmq.ZMQError, OSError) as exc:
            log.warning("inference server %s answered its health check but not a connection: %s", server.address, exc)
            return False
        self._all_down_since = None
        log.info(
            "using inference server %s (%s); %d of %d up",
            server.address,
            self.transport,
            len(self.live()),
            len(self.servers),
        )
        return True

    def _mark_down(self, server: _Server, reason: Exception) -> None:
        if server.client is None:
            return
        try:
            server.client.close()
        except Exception:  # closing a broken connection may fail too; it is dropped either way
            pass
        server.client = None
        server.next_probe = time.monotonic() + self.settings.probe_interval_s
        self.failovers += 1
        if not self.live():
            self._all_down_since = time.monotonic()
        log.warning(
            "inference server %s is down (%s); %d of %d up", server.address, reason, len(self.live()), len(self.servers)
        )

    def _probe_due(self) -> None:
        now = time.monotonic()
        for server in self.servers:
            if server.client is None and now >= server.next_probe:
                self._try_connect(server)

    def _next_server(self) -> _Server:
        """The next live server in turn; while none is, keep probing until all_down_timeout_s."""
        while True:
            self._probe_due()
            live = [s for s in self.servers if s.client is not None]
            if live:
                self._turn += 1
                return live[self._turn % len(live)]
            if self.should_stop():
                raise StopWaiting()
            down_for = time.monotonic() - (self._all_down_since or time.monotonic())
            if down_for > self.settings.all_down_timeout_s:
                raise InferenceError(
                    f"all inference servers ({', '.join(s.address for s in self.servers)}) "
                    f"have been unreachable for {down_for:.0f}s "
                    f"(actor.failover.all_down_timeout_s={self.settings.all_down_timeout_s:g})"
                )
            time.sleep(0.2)

    # ---- requests ---------------------------------------------------------------------------
    def submit(self, stage: int, lo: int, hi: int, deterministic: bool = False) -> None:
        self._pending[stage] = _Request(lo, hi, deterministic)
        self._send(stage)

    def _send(self, stage: int) -> None:
        req = self._pending[stage]
        while True:
            server = self._next_server()
            try:
                server.client.submit(stage, req.lo, req.hi, req.deterministic)
            except (InferenceUnavailable, zmq.ZMQError) as exc:
                self._mark_down(server, exc)
                continue
            req.server, req.client = server, server.client
            return

    def wait(self, stage: int) -> int:
        """The policy version of the answer for `stage`, whichever server gave it."""
        req = self._pending[stage]
        while True:
            if req.server.client is not req.client:  # its server went down meanwhile: the request died with it
                self._resend(stage, req.server.address)
                continue
            try:
                version = req.client.wait(stage)
            except InferenceUnavailable as exc:
                self._mark_down(req.server, exc)
                continue
            del self._pending[stage]
            return version

    def _resend(self, stage: int, failed: str) -> None:
        self.retried += 1
        self._send(stage)
        log.info("stage %d's request moved from %s to %s", stage, failed, self._pending[stage].server.address)

    def close(self) -> None:
        for server in self.servers:
            if server.client is not None:
                server.client.close()
                server.client = None


def connect_fleet(
    transport: str,
    addresses: str | Sequence[str],
    slots: SharedArrays,
    actor_id: str = "",
    should_stop: Callable[[], bool] = lambda: False,
    settings: InferenceFailoverConfig | None = None,
):
    """One plain client for a single shm server (no failover: see the module doc), else failover."""
    if transport not in ("shm", "zmq", "grpc"):
        raise ValueError(f"unknown transport {transport!r} (shm, zmq or grpc)")
    addrs = parse_addresses(addresses)
    settings = settings or InferenceFailoverConfig()
    if transport == "shm" and len(addrs) == 1:
        return connect_inference(transport, addrs[0], slots, actor_id, should_stop, settings.request_timeout_s)
    return FailoverInferenceClient(transport, addrs, slots, actor_id, should_stop, settings)
