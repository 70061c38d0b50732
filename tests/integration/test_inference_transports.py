"""A real inference server on loopback: every transport, many actors, bad input, a dead actor."""

from __future__ import annotations

import struct
import threading
import time

import grpc
import numpy as np
import pytest
import torch
import zmq

from rlfleet.actors.inference_client import InferenceError, connect_inference, server_info
from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.inference_server.server import InferenceServer
from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire import codec
from rlfleet.wire.gen import inference_pb2, inference_pb2_grpc, tensor_pb2
from rlfleet.wire.shm import SharedArrays
from rlfleet.wire.slots import slot_layout

S, D, K = 7, 3, 2


def layout(n: int):
    return slot_layout(n, {"states": ((S,), "float32")}, D, K)


@pytest.fixture
def server():
    torch.manual_seed(0)
    policy = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[16]))
    srv = InferenceServer(PolicyRunner(policy, version=5), "127.0.0.1", 0, 0, max_batch=64, max_wait_ms=2)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(10)


@pytest.fixture
def slots():
    blk = SharedArrays.create(layout(8))
    blk["states"][:] = np.random.default_rng(0).normal(size=(8, S)).astype(np.float32)
    yield blk
    blk.close()


def _expected(srv, states):
    out = srv.runner.policy.act({"states": torch.from_numpy(states)}, deterministic=True)
    return out["actions"].numpy(), out["values"].numpy()


@pytest.mark.parametrize("transport", ["shm", "zmq", "grpc"])
def test_each_transport_returns_the_policy_outputs(server, slots, transport):
    client = connect_inference(transport, server.address, slots)
    try:
        client.submit(0, 0, 4, deterministic=True)
        client.submit(1, 4, 8, deterministic=False)
        assert client.wait(1) == 5 and client.wait(0) == 5  # answers may be collected in any order
    finally:
        client.close()
    actions, values = _expected(server, slots["states"][:4].copy())
    np.testing.assert_allclose(slots["actions"][:4], actions, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        slots["values"][:8], _expected(server, slots["states"][:8].copy())[1], rtol=1e-5, atol=1e-6
    )
    assert np.isfinite(slots["logprobs"][:8]).all() and not np.allclose(slots["actions"][4:], 0)


def test_server_info_and_health(server):
    info = server_info(server.address)
    assert (info.state_dim, info.action_dim, info.chunk_size, info.policy_version) == (S, D, K, 5)
    assert info.zmq_endpoint.startswith("tcp://127.0.0.1:")
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.address) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="rlfleet.v1.InferenceService")
        )
    assert status.status == health_pb2.HealthCheckResponse.SERVING


def test_many_actors_at_once_are_batched_together(server):
    blocks = [SharedArrays.create(layout(8)) for _ in range(6)]
    clients = [connect_inference(t, server.address, b) for t, b in zip(["shm", "zmq", "grpc"] * 2, blocks)]
    errors = []

    def run(client):
        try:
            for _ in range(20):
                client.submit(0, 0, 8)
                assert client.wait(0) == 5
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c, b in zip(clients, blocks):
        c.close()
        b.close()
    assert not errors
    stats = server.stats()
    assert stats.rows == 6 * 20 * 8 and stats.batches < 6 * 20  # some requests shared a batch


def test_malformed_zmq_messages_get_clear_errors_and_serving_goes_on(server, slots):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.zmq.endpoint)
    rid = struct.pack("<Q", 1)
    header = tensor_pb2.TensorMap(schema_version=1)
    header.tensors.append(tensor_pb2.Tensor(name="states", dtype="float32", shape=[2, S]))
    bad_dtype = tensor_pb2.TensorMap(schema_version=1)
    bad_dtype.tensors.append(tensor_pb2.Tensor(name="states", dtype="complex64", shape=[1, S]))
    cases = {
        "wrong size": [b"act", rid, b"\0", header.SerializeToString(), b"\0" * 10],
        "unknown dtype": [b"act", rid, b"\0", bad_dtype.SerializeToString(), b"\0" * 8 * S],
        "wrong state dim": [b"act", rid, b"\0", *codec.encode_frames({"states": np.zeros((2, S + 1), np.float32)})],
        "nan": [b"act", rid, b"\0", *codec.encode_frames({"states": np.full((1, S), np.nan, np.float32)})],
        "act_shm before attach": [b"act_shm", rid, struct.pack("<qqq", 0, 1, 0)],
        "unknown kind": [b"hello", rid],
        "short": [b"act"],
    }
    replies = {}
    for name, frames in cases.items():
        sock.send_multipart(frames)
        assert sock.poll(5000), name
        replies[name] = sock.recv_multipart()
    sock.close()
    assert all(r[0] == b"error" for r in replies.values()), replies
    assert b"10 bytes of data for dtype float32" in replies["wrong size"][2]
    assert b"unknown dtype 'complex64'" in replies["unknown dtype"][2]
    assert f"float32 [B, {S}]".encode() in replies["wrong state dim"][2]
    assert b"NaN" in replies["nan"][2]
    assert server.stats().errors >= len(cases)
    client = connect_inference("zmq", server.address, slots)  # still serving
    client.submit(0, 0, 8)
    assert client.wait(0) == 5
    client.close()


def test_malformed_grpc_request_gets_an_error_and_the_stream_stays_open(server):
    good = codec.encode_map({"states": np.zeros((2, S), np.float32)})
    bad = tensor_pb2.TensorMap(schema_version=1)
    bad.tensors.append(tensor_pb2.Tensor(name="states", dtype="float32", shape=[2, S], data=b"\0" * 3))
    with grpc.insecure_channel(server.address) as ch:
        stub = inference_pb2_grpc.InferenceServiceStub(ch)
        reqs = [inference_pb2.ActRequest(request_id=1, obs=bad), inference_pb2.ActRequest(request_id=2, obs=good)]
        replies = {r.request_id: r for r in stub.Act(iter(reqs), timeout=10)}
    assert "3 bytes of data" in replies[1].error
    assert replies[2].error == "" and replies[2].policy_version == 5
    assert codec.decode_map(replies[2].outputs)["actions"].shape == (2, K, D)


def test_a_dead_actor_does_not_stall_the_others(server, slots):
    ghost = zmq.Context.instance().socket(zmq.DEALER)
    ghost.setsockopt(zmq.LINGER, 0)
    ghost.connect(server.zmq.endpoint)
    frames = codec.encode_frames({"states": np.zeros((4, S), np.float32)})
    ghost.send_multipart([b"act", struct.pack("<Q", 9), b"\0", *frames])
    ghost.close()  # dies with a request in flight, never reads the answer
    client = connect_inference("shm", server.address, slots)
    t0 = time.monotonic()
    for _ in range(50):
        client.submit(0, 0, 8)
        client.wait(0)
    client.close()
    assert time.monotonic() - t0 < 20


def test_rejected_request_surfaces_as_inference_error(server):
    blk = SharedArrays.create(layout(2))
    blk["states"][0, 0] = np.nan
    client = connect_inference("shm", server.address, blk)
    try:
        client.submit(0, 0, 2)
        with pytest.raises(InferenceError, match="NaN"):
            client.wait(0)
    finally:
        client.close()
        blk.close()
