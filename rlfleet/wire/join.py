"""How a role process joins a fleet: register with the learner (the run's config comes back),
write the address file a launcher waits on, and stop cleanly on SIGINT / SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import threading
from pathlib import Path

import grpc

from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel

# Exit codes, one rule for every command and role (docs/usage.md): 0 done; 1 the run failed (a
# role crashed, an uncaught error); 2 bad input (config, paths, arguments, credentials, an env that
# cannot be made, a server that cannot be reached), said in one line; 130 interrupted (SIGINT/SIGTERM).
EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class CommandError(RuntimeError):
    """A failure whose message says it all (which role or server, where its log is): a command
    prints it as one line and exits with `exit_code` (rlfleet.wire.role_args.run_command)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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


def report_exit(address: str, client_id: str, cause: str, timeout_s: float = 5.0) -> None:
    """Tell the learner this client dies of `cause` (one line), so its log says so and its index
    goes to the next client; best effort: a learner that cannot be reached is not waited for."""
    try:
        with make_channel(address) as ch:
            learner_pb2_grpc.LearnerServiceStub(ch).Heartbeat(
                learner_pb2.HeartbeatRequest(client_id=client_id, exit_cause=cause[:1000]), timeout=timeout_s
            )
    except grpc.RpcError:
        pass


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
