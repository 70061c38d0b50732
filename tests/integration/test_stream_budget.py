"""Idle long-lived gRPC streams must not starve new calls (health, Act, Push, Heartbeat).

Each gRPC call holds a server thread for as long as it lasts; streams get their own budget,
an idle limit and keepalive (`rlfleet.wire.grpc_limits`), so a server keeps answering.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.inference_server.server import InferenceServer
from rlfleet.learner.ingest import IngestQueue
from rlfleet.learner.service import LearnerServicer
from rlfleet.learner.weight_publisher import WeightPublisher
from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire import codec
from rlfleet.wire.gen import inference_pb2, inference_pb2_grpc, learner_pb2, learner_pb2_grpc
from rlfleet.wire.grpc_decoding import add_servicer
from rlfleet.wire.grpc_limits import StreamLimits
from rlfleet.wire.grpc_server import make_channel, start_grpc_server

S, D, K = 7, 3, 2
IDLE_STREAMS = 60  # more than the old shared pool of 32 threads


def _idle(stop: threading.Event):
    stop.wait()
    return
    yield  # a generator that sends nothing until told to


def _wait_open(server, n: int) -> None:
    deadline = time.monotonic() + 60
    while server.stream_budget.open_streams < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.stream_budget.open_streams >= n, server.stream_budget.open_streams


@pytest.fixture
def inference():
    torch.manual_seed(0)
    policy = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[16]))
    srv = InferenceServer(PolicyRunner(policy, version=2), "127.0.0.1", 0, 0, max_batch=64, max_wait_ms=1)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(10)


def test_idle_act_streams_do_not_starve_new_calls(inference):
    stop = threading.Event()
    ch = grpc.insecure_channel(inference.address)
    stub = inference_pb2_grpc.InferenceServiceStub(ch)
    calls = [stub.Act(_idle(stop)) for _ in range(IDLE_STREAMS)]
    try:
        _wait_open(inference.grpc_server, IDLE_STREAMS)
        with grpc.insecure_channel(inference.address) as fresh:
            health = health_pb2_grpc.HealthStub(fresh).Check(health_pb2.HealthCheckRequest(), timeout=30)
            info = inference_pb2_grpc.InferenceServiceStub(fresh).GetInfo(inference_pb2.InfoRequest(), timeout=30)
            obs = codec.encode_map({"states": np.ones((2, S), np.float32)})
            (reply,) = list(
                inference_pb2_grpc.InferenceServiceStub(fresh).Act(
                    iter([inference_pb2.ActRequest(request_id=1, obs=obs)]), timeout=30
                )
            )
        assert health.status == health_pb2.HealthCheckResponse.SERVING and info.policy_version == 2
        assert reply.error == "" and reply.policy_version == 2
    finally:
        stop.set()
        for c in calls:
            c.cancel()
        ch.close()


@pytest.fixture
def learner_server():
    ingest, publisher = IngestQueue(maxsize=4), WeightPublisher()
    publisher.publish(0, b"weights")
    servicer = LearnerServicer("x: 1\n", "run", ingest, publisher)
    server, port = start_grpc_server(
        "127.0.0.1",
        0,
        [
            lambda s: add_servicer(
                learner_pb2_grpc.add_LearnerServiceServicer_to_server, servicer, s, servicer.other_rejections.count
            )
        ],
        ["rlfleet.v1.LearnerService"],
        limits=StreamLimits(max_streams=80, idle_s=600),
        on_refused=servicer.other_rejections.count,
    )
    yield servicer, server, f"127.0.0.1:{port}"
    publisher.finish()
    server.stop(grace=0)


def test_idle_push_and_watch_streams_do_not_starve_the_learner(learner_server):
    servicer, server, address = learner_server
    stop = threading.Event()
    ch = grpc.insecure_channel(address)
    stub = learner_pb2_grpc.LearnerServiceStub(ch)
    pushes = [stub.PushTrajectory.future(_idle(stop)) for _ in range(IDLE_STREAMS // 2)]
    watches = [stub.WatchWeights(learner_pb2.WatchRequest(known_version=0)) for _ in range(IDLE_STREAMS // 2)]
    try:
        _wait_open(server, IDLE_STREAMS)
        with grpc.insecure_channel(address) as fresh:
            fstub = learner_pb2_grpc.LearnerServiceStub(fresh)
            reg = fstub.Register(learner_pb2.RegisterRequest(client_id="a", role="actor"), timeout=30)
            beat = fstub.Heartbeat(learner_pb2.HeartbeatRequest(client_id="a"), timeout=30)
            ack = fstub.PushTrajectory(
                iter([learner_pb2.TrajectoryChunk(client_id="a", segment_id=1, num_chunks=1, payload=b"\xff")]),
                timeout=30,
            )
        assert reg.run_id == "run" and beat.policy_version == 0
        assert not ack.accepted and ack.error  # answered (a garbage segment, refused as such)
        # a stream over the budget is refused at once, and counted
        more = [stub.WatchWeights(learner_pb2.WatchRequest(known_version=-1)) for _ in range(30)]  # answered at once
        refused = 0
        for call in more:
            try:
                next(call)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    refused += 1
        assert refused >= 10 and servicer.rejected_calls().get("too_many_streams") == refused
        for call in more:
            call.cancel()
    finally:
        stop.set()
        for c in [*pushes, *watches]:
            c.cancel()
        ch.close()


def test_a_silent_request_stream_is_closed_after_the_idle_limit():
    ingest, publisher = IngestQueue(maxsize=4), WeightPublisher()
    servicer = LearnerServicer("x: 1\n", "run", ingest, publisher)
    server, port = start_grpc_server(
        "127.0.0.1",
        0,
        [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s)],
        ["rlfleet.v1.LearnerService"],
        limits=StreamLimits(max_streams=8, idle_s=0.5),
        on_refused=servicer.other_rejections.count,
    )
    stop = threading.Event()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = learner_pb2_grpc.LearnerServiceStub(ch).PushTrajectory.future(_idle(stop))
            with pytest.raises(grpc.RpcError) as err:
                call.result(timeout=60)
            assert err.value.code() == grpc.StatusCode.CANCELLED
        assert server.stream_budget.idle_closed == 1 and servicer.rejected_calls() == {"stream_idle": 1}
        deadline = time.monotonic() + 30
        while server.stream_budget.open_streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.stream_budget.open_streams == 0  # its slot is free again
    finally:
        stop.set()
        server.stop(grace=0)


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    """A throwaway certificate for 127.0.0.1 (the openssl CLI)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_unauthenticated_health_streams_cannot_spend_the_budget_of_authenticated_work(tls, request):
    """Was: with a token set (with and without TLS), 260 tokenless health Watch streams took the
    whole 256-stream budget and an authenticated PushTrajectory got RESOURCE_EXHAUSTED. Now health
    and reflection streams have their own small budget (max_open_streams)."""
    from rlfleet.wire.auth import AuthConfig

    if tls:
        cert, key = request.getfixturevalue("self_signed")
        auth = AuthConfig(token="s3cret", tls_cert=cert, tls_key=key, tls_ca=cert)
        with open(cert, "rb") as f:
            stranger_creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    else:
        auth = AuthConfig(token="s3cret")
    ingest, publisher = IngestQueue(maxsize=4), WeightPublisher()
    publisher.publish(0, b"weights")
    servicer = LearnerServicer("x: 1\n", "run", ingest, publisher)
    limits = StreamLimits(max_streams=8, max_open_streams=4, idle_s=600)
    server, port = start_grpc_server(
        "127.0.0.1",
        0,
        [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s)],
        ["rlfleet.v1.LearnerService"],
        auth=auth,
        limits=limits,
        on_refused=servicer.other_rejections.count,
    )
    address = f"127.0.0.1:{port}"
    # the stranger speaks TLS where the server does, but has no token
    stranger = grpc.secure_channel(address, stranger_creds) if tls else grpc.insecure_channel(address)
    watches = [health_pb2_grpc.HealthStub(stranger).Watch(health_pb2.HealthCheckRequest()) for _ in range(20)]
    try:
        _wait_open(server, limits.max_open_streams)
        refused = 0
        for w in watches:  # admitted ones answer SERVING at once (in arrival order, not list order)
            try:
                next(w)
            except grpc.RpcError as exc:
                refused += exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused == 20 - limits.max_open_streams
        assert servicer.rejected_calls() == {"too_many_open_streams": refused}
        with make_channel(address, auth) as mine:  # the token holder's streams are all still there
            stub = learner_pb2_grpc.LearnerServiceStub(mine)
            ack = stub.PushTrajectory(
                iter([learner_pb2.TrajectoryChunk(client_id="a", segment_id=1, num_chunks=1, payload=b"\xff")]),
                timeout=30,
            )
            assert not ack.accepted and ack.error  # answered (refused as undecodable), not RESOURCE_EXHAUSTED
            announced = next(iter(stub.WatchWeights(learner_pb2.WatchRequest(known_version=-1), timeout=30)))
            assert announced.version == 0
        with pytest.raises(grpc.RpcError) as err:  # tokenless work is refused before it takes a slot
            learner_pb2_grpc.LearnerServiceStub(stranger).PushTrajectory(iter([]), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        for w in watches:
            w.cancel()
        stranger.close()
        publisher.finish()
        server.stop(grace=0)


def test_a_register_flood_cannot_fill_the_client_table(learner_server):
    """Was: without a token, 4,090 Register calls in 2.8 s filled the 4,096-client table for 600 s.
    Now new ids from one peer host are rate limited (a burst, then a rate) and refusals counted."""
    from rlfleet.learner.service import FORGET_CLIENT_S, MAX_CLIENTS, REGISTER_BURST, REGISTER_PER_S

    servicer, _, address = learner_server
    with grpc.insecure_channel(address) as ch:
        stub = learner_pb2_grpc.LearnerServiceStub(ch)
        stub.Register(learner_pb2.RegisterRequest(client_id="mine", role="actor"), timeout=30)
        t0 = time.monotonic()
        admitted = refused = 0
        for i in range(4090):
            try:
                stub.Register(learner_pb2.RegisterRequest(client_id=f"flood-{i}", role="actor"), timeout=30)
                admitted += 1
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                refused += 1
        elapsed = time.monotonic() - t0
        # a known id re-registers whatever the flood did (an actor reconnecting)
        again = stub.Register(learner_pb2.RegisterRequest(client_id="mine", role="actor"), timeout=30)
    assert again.registrations == 1
    assert admitted <= REGISTER_BURST + REGISTER_PER_S * elapsed + 1, (admitted, elapsed)
    assert servicer.rejected_calls().get("register_rate") == refused == 4090 - admitted
    # what one host can hold at most while entries live FORGET_CLIENT_S: well under the table
    assert REGISTER_BURST + REGISTER_PER_S * FORGET_CLIENT_S < MAX_CLIENTS
    print(f"register flood: {admitted} admitted, {refused} refused in {elapsed:.1f} s")


def test_each_token_identity_has_its_share_of_streams_and_client_entries(tmp_path, monkeypatch):
    """With several token identities (RLFLEET_IDENTITIES_FILE), one cannot exhaust the stream budget
    or the client table another needs: each holds at most its share."""
    from rlfleet.learner import service
    from rlfleet.wire.auth import AuthConfig

    monkeypatch.setattr(service, "MAX_CLIENTS", 12)
    ids = tmp_path / "identities"
    ids.write_text("# name token\nalice a-token\nbob b-token\n")
    ids.chmod(0o600)
    server_auth = AuthConfig(token="fleet-token", identities_file=str(ids))  # three identities
    ingest, publisher = IngestQueue(maxsize=4), WeightPublisher()
    publisher.publish(0, b"weights")
    servicer = LearnerServicer("x: 1\n", "run", ingest, publisher, auth=server_auth)
    server, port = start_grpc_server(
        "127.0.0.1",
        0,
        [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s)],
        ["rlfleet.v1.LearnerService"],
        auth=server_auth,
        limits=StreamLimits(max_streams=9, idle_s=600),
        on_refused=servicer.other_rejections.count,
    )
    address, stop = f"127.0.0.1:{port}", threading.Event()
    alice_ch = make_channel(address, AuthConfig(token="a-token"))
    bob_ch = make_channel(address, AuthConfig(token="b-token"))
    alice, bob = learner_pb2_grpc.LearnerServiceStub(alice_ch), learner_pb2_grpc.LearnerServiceStub(bob_ch)
    held = [alice.PushTrajectory.future(_idle(stop)) for _ in range(3)]  # alice's share: 9 // 3
    try:
        _wait_open(server, 3)
        with pytest.raises(grpc.RpcError) as err:  # a fourth is hers no more
            alice.PushTrajectory(iter([]), timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "alice" in err.value.details()
        ack = bob.PushTrajectory(
            iter([learner_pb2.TrajectoryChunk(client_id="b", segment_id=1, num_chunks=1, payload=b"\xff")]),
            timeout=30,
        )
        assert not ack.accepted and ack.error  # bob's push is answered (refused as undecodable)
        # the client table: 12 // 3 entries each
        for i in range(4):
            alice.Register(learner_pb2.RegisterRequest(client_id=f"alice-{i}", role="actor"), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            alice.Register(learner_pb2.RegisterRequest(client_id="alice-4", role="actor"), timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        alice.Register(learner_pb2.RegisterRequest(client_id="alice-0", role="actor"), timeout=30)  # a known id
        for i in range(4):
            bob.Register(learner_pb2.RegisterRequest(client_id=f"bob-{i}", role="actor"), timeout=30)
        assert servicer.rejected_calls() == {"identity_streams": 1, "identity_clients": 1}
    finally:
        stop.set()
        for c in held:
            c.cancel()
        alice_ch.close()
        bob_ch.close()
        publisher.finish()
        server.stop(grace=0)
