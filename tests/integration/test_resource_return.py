"""Resources return: after a storm of clients and their departure, the inference server and the
learner hold about as many fds and threads as before it (issue 51, case 8).

Was: after a fuzz storm the inference server held 234-242 fds (18 before) and 82 threads (15
before) for good: gRPC's thread pool never shrinks, and every Act stream's reader thread left a
ZeroMQ socket (an eventfd) behind. Now the gRPC servers' pool ends threads idle 10 s
(`rlfleet.wire.worker_pool`) and the ZeroMQ front end has one socket for other threads' answers.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time

import grpc
import pytest
import zmq
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.wire.gen import inference_pb2, inference_pb2_grpc, learner_pb2, learner_pb2_grpc
from rlfleet.wire.shm import SharedArrays
from rlfleet.wire.slots import slot_layout

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="measures /proc")]

FD_MARGIN = 6  # fds a server may hold above its start (a connection still closing)
THREAD_MARGIN = 4  # threads likewise (a gRPC worker finishing its call)
CLIENTS = 40


def _held(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


def _idle(stop: threading.Event):
    stop.wait()
    return
    yield


def _settle(pid: int, before: tuple[int, int]) -> tuple[int, int]:
    """Waits (bounded) until the server is back within the margins; returns what it holds."""
    deadline = time.monotonic() + 90  # idle gRPC threads end after 10 s
    held = _held(pid)
    while time.monotonic() < deadline:
        held = _held(pid)
        if held[0] <= before[0] + FD_MARGIN and held[1] <= before[1] + THREAD_MARGIN:
            break
        time.sleep(0.5)
    return held


def _storm_inference(address: str, stop: threading.Event) -> list:
    """Many connections, each with a bad Act, idle Act streams and a health Watch; ZeroMQ peers
    that attach shared-memory blocks and send garbage. Returns what must be closed."""
    channels, calls = [], []
    for i in range(CLIENTS):
        ch = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        channels.append(ch)
        stub = inference_pb2_grpc.InferenceServiceStub(ch)
        raw = ch.stream_stream(
            "/rlfleet.v1.InferenceService/Act",
            request_serializer=None,
            response_deserializer=inference_pb2.ActResponse.FromString,
        )
        try:
            list(raw(iter([os.urandom(40 + i)]), timeout=30))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
        calls += [stub.Act(_idle(stop)) for _ in range(3)]
        calls.append(health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest()))
    info = inference_pb2_grpc.InferenceServiceStub(channels[0]).GetInfo(inference_pb2.InfoRequest(), timeout=30)
    blocks, socks = [], []
    for _ in range(20):
        blk = SharedArrays.create(slot_layout(4, {"states": ((5,), "float32")}, 3, 2))
        blocks.append(blk)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(info.zmq_endpoint)
        socks.append(sock)
        lay = {k: [list(v.shape), v.dtype] for k, v in blk.layout.items()}
        for frames in (
            [b"attach", struct.pack("<Q", 1), json.dumps({"shm_name": blk.name, "layout": lay, "secret": blk.secret})],
            [b"act_shm", struct.pack("<Q", 2), struct.pack("<qqq", 0, 4, 0)],
            [b"act", struct.pack("<Q", 3), os.urandom(64)],
        ):
            sock.send_multipart([f.encode() if isinstance(f, str) else f for f in frames])
            assert sock.poll(30_000), frames[0]
            sock.recv_multipart()
    return [*calls, *channels, *socks, *blocks]


def _storm_learner(address: str, stop: threading.Event) -> list:
    channels, calls = [], []
    for i in range(CLIENTS):
        ch = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        channels.append(ch)
        stub = learner_pb2_grpc.LearnerServiceStub(ch)
        stub.Register(learner_pb2.RegisterRequest(client_id=f"storm-{i}", role="actor"), timeout=30)
        stub.Heartbeat(learner_pb2.HeartbeatRequest(client_id=f"storm-{i}"), timeout=30)
        ack = stub.PushTrajectory(
            iter([learner_pb2.TrajectoryChunk(client_id=f"storm-{i}", segment_id=1, num_chunks=1, payload=b"\xff")]),
            timeout=30,
        )
        assert not ack.accepted
        calls.append(stub.PushTrajectory.future(_idle(stop)))
        calls.append(stub.WatchWeights(learner_pb2.WatchRequest(known_version=10**9)))
        calls.append(health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest()))
    return [*calls, *channels]


def _close(things: list) -> None:
    for t in things:
        if hasattr(t, "cancel"):
            t.cancel()
    for t in things:
        if hasattr(t, "close") and not hasattr(t, "cancel"):
            t.close()


def test_fds_and_threads_return_after_a_storm_and_its_clients_departure(roles, tmp_path):
    learner, laddr = roles.learner(tmp_path / "run", "runner.total_env_steps=100000000", "eval.at_end=false")
    inference, iaddr = roles.inference(laddr)
    # one real actor first: the servers' lazily started parts (batching, weights, ingest) are up
    actor = roles.actor("actor-warm", laddr, iaddr, "shm")
    time.sleep(25)
    roles.kill_group(actor)
    actor.wait(30)
    time.sleep(12)  # the warm-up's idle gRPC threads end
    before = {"inference": _held(inference.pid), "learner": _held(learner.pid)}

    stop = threading.Event()
    held_open = _storm_inference(iaddr, stop) + _storm_learner(laddr, stop)
    # real clients too: two actors over shm and grpc, killed without a goodbye
    actors = [roles.actor(f"actor-{t}", laddr, iaddr, t) for t in ("shm", "grpc")]
    time.sleep(15)
    during = {"inference": _held(inference.pid), "learner": _held(learner.pid)}
    for a in actors:
        roles.kill_group(a)
        a.wait(30)
    stop.set()
    _close(held_open)

    after = {role: _settle(proc.pid, before[role]) for role, proc in (("inference", inference), ("learner", learner))}
    print(f"fds, threads: before {before}, during {during}, after {after}")
    for role in ("inference", "learner"):
        assert during[role][1] > before[role][1] + 2 * THREAD_MARGIN, (role, during, before)  # the storm was felt
        assert after[role][0] <= before[role][0] + FD_MARGIN, (role, before[role], after[role])
        assert after[role][1] <= before[role][1] + THREAD_MARGIN, (role, before[role], after[role])
    assert inference.poll() is None and learner.poll() is None
