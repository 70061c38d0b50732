"""gRPC servers and channels with the project's defaults: loopback, health, reflection, limits."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def check_bind_host(host: str) -> None:
    """Only loopback until the token/TLS work lands: refuse to expose an unauthenticated server."""
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("127."):
        raise ValueError(
            f"refusing to bind {host!r}: rlfleet servers bind to loopback (127.0.0.1) by default "
            "and authentication for other addresses is not available yet"
        )


def start_grpc_server(
    host: str, port: int, register: Sequence[Callable[[grpc.Server], None]], service_names: Sequence[str],
    max_workers: int = 32,
) -> tuple[grpc.Server, int]:
    """Start a server with the given servicers plus health checking and reflection; returns the bound port."""
    check_bind_host(host)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=_OPTIONS)
    for add in register:
        add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in service_names:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC server to {host}:{port}")
    server.start()
    return server, bound


def make_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=_OPTIONS[:2])
