"""How a role process joins a fleet: register with the learner (the run's config comes back),
write the address file a launcher waits on, and stop cleanly on SIGINT / SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import threading
from pathlib import Path

from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel


def register(
    address: str, client_id: str, role: str, num_envs: int = 0, timeout_s: float = 120.0
) -> learner_pb2.RegisterReply:
    """Register with the learner, waiting for it to come up (a learner may start after us)."""
    with make_channel(address) as ch:
        stub = learner_pb2_grpc.LearnerServiceStub(ch)
        return stub.Register(
            learner_pb2.RegisterRequest(client_id=client_id, role=role, host=socket.gethostname(), num_envs=num_envs),
            timeout=timeout_s,
            wait_for_ready=True,
        )


def write_address(path: str | None, **addresses: str) -> None:
    """`{"learner": "HOST:PORT", ...}` at `path` (nothing when None), written atomically so a
    launcher polling for it never reads half a file."""
    if path:
        tmp = Path(path + ".tmp")
        tmp.write_text(json.dumps(addresses))
        tmp.replace(path)


def stop_on_signals(event: threading.Event) -> None:
    """Set `event` on SIGINT or SIGTERM (Ctrl-C, a launcher stopping its children)."""

    def handler(signum: int, frame: object) -> None:
        event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
