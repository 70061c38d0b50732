"""gRPC servers and channels with the project's defaults: loopback, token/TLS, health, reflection, limits."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rlfleet.wire.auth import (
    MAX_MESSAGE_BYTES,
    AuthConfig,
    add_server_port,
    check_bind_host,
    grpc_options,
    identity_of,
    identity_table,
    resolve,
    secure_channel,
    server_interceptors,
)
from rlfleet.wire.grpc_limits import StreamBudget, StreamLimits
from rlfleet.wire.worker_pool import ShrinkingThreadPool

__all__ = ["MAX_MESSAGE_BYTES", "check_bind_host", "make_channel", "start_grpc_server"]


def start_grpc_server(
    host: str,
    port: int,
    register: Sequence[Callable[[grpc.Server], None]],
    service_names: Sequence[str],
    max_workers: int = 32,
    auth: AuthConfig | None = None,
    limits: StreamLimits | None = None,
    on_refused: Callable[[str], None] | None = None,
) -> tuple[grpc.Server, int]:
    """Start a server with the given servicers plus health checking and reflection; returns the bound port.

    Non-loopback hosts need a token (`rlfleet.wire.auth`); with one, every call but health checks
    must carry it. `auth` defaults to the process-wide settings. `max_workers` threads serve
    unary calls; streaming calls get `limits.max_streams` more (`rlfleet.wire.grpc_limits`), and
    a refused or idle-closed stream is reported to `on_refused(reason)`.
    """
    cfg = resolve(auth)
    check_bind_host(host, cfg)
    limits = limits or StreamLimits.from_env()
    table = identity_table(cfg)
    budget = StreamBudget(limits, on_refused, lambda md: identity_of(md, cfg), identities=len(table))
    server = grpc.server(
        # threads idle 10 s end: a burst of calls does not leave hundreds behind for good
        ShrinkingThreadPool(max_workers + limits.max_streams + limits.max_open_streams, idle_s=10.0),
        interceptors=[*server_interceptors(cfg), budget],
        options=[*grpc_options(cfg), *limits.options(), ("grpc.so_reuseport", 0)],
    )
    server.stream_budget = budget  # its counters, for tests and metrics
    for add in register:
        add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in service_names:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bound = add_server_port(server, f"{host}:{port}", cfg)
    if bound == 0:
        raise OSError(f"could not bind gRPC server to {host}:{port}")
    server.start()
    return server, bound


def make_channel(address: str, auth: AuthConfig | None = None) -> grpc.Channel:
    """A channel with the message size limit, the token on every call and TLS where configured."""
    return secure_channel(address, auth)
