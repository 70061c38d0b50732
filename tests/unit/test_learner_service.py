import hashlib
import math
import os
import re
import threading

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.learner.ingest import IngestQueue
from rlfleet.learner.service import LearnerServicer
from rlfleet.learner.weight_publisher import WeightPublisher
from rlfleet.wire import codec
from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel, start_grpc_server
from rlfleet.wire.run_spec import RunSpec, registered_spec
from rlfleet.wire.segment import Segment

SERVICE = "rlfleet.v1.LearnerService"
CONFIG_YAML = "runner:\n  experiment_name: unit\n"
RUN_SPEC = RunSpec(3, 2, logprob_shape=(1,), policy={"name": "gaussian_mlp"}, resumed_from_env_steps=64)
T, B, S, K, D = 3, 2, 4, 1, 2
RPC_TIMEOUT = 10.0


def make_segment(seed: int = 0, **override) -> Segment:
    rng = np.random.default_rng(seed)
    fields = dict(
        obs={"states": rng.normal(size=(T, B, S)).astype(np.float32)},
        actions=rng.normal(size=(T, B, K, D)).astype(np.float32),
        logprobs=rng.normal(size=(T, B)).astype(np.float32),
        values=rng.normal(size=(T, B)).astype(np.float32),
        rewards=rng.normal(size=(T, B)).astype(np.float32),
        terminated=np.array([[False, False], [True, False], [False, False]]),
        truncated=np.array([[False, False], [False, False], [False, True]]),
        final_obs={"states": np.zeros((T, B, S), np.float32)},
        next_obs={"states": rng.normal(size=(B, S)).astype(np.float32)},
        versions=np.array([4, 4, 5], np.int64),
        task_ids=np.array([0, 1], np.int64),
        env_steps=np.array(T * B * K, np.int64),
        ep_returns=np.array([1.5, -0.5], np.float32),
        ep_lengths=np.array([2, 3], np.int32),
        ep_success=np.array([True, False]),
        ep_task_ids=np.array([0, 1], np.int64),
        extras={},
    )
    fields["final_obs"]["states"][1, 0] = 1.0
    fields["final_obs"]["states"][2, 1] = 2.0
    fields.update(override)
    return Segment(**fields)


def segment_bytes(tensors: dict) -> bytes:
    return codec.encode_map(tensors).SerializeToString()


def chunks_of(payload: bytes, client_id: str, segment_id: int, chunk_size: int = 64):
    pieces = codec.split_chunks(payload, chunk_size)
    return [
        learner_pb2.TrajectoryChunk(
            client_id=client_id, segment_id=segment_id, chunk_index=i, num_chunks=len(pieces), payload=bytes(p)
        )
        for i, p in enumerate(pieces)
    ]


class Fleet:
    def __init__(self):
        self.ingest = IngestQueue(maxsize=8)
        self.publisher = WeightPublisher()
        self.servicer = LearnerServicer(
            CONFIG_YAML, "run123", self.ingest, self.publisher, chunk_bytes=4096, heartbeat_ms=250, run_spec=RUN_SPEC
        )
        self.server, self.port = start_grpc_server(
            "127.0.0.1",
            0,
            [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(self.servicer, s)],
            [SERVICE],
            max_workers=8,
        )
        self.channel = make_channel(f"127.0.0.1:{self.port}")
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)

    def push(self, chunks) -> learner_pb2.PushAck:
        return self.stub.PushTrajectory(iter(chunks), timeout=RPC_TIMEOUT)

    def close(self):
        self.servicer.stop_event.set()
        self.publisher.finish()
        self.channel.close()
        self.server.stop(grace=None).wait(5)
        # the server does not own its executor: shut it down so no handler thread outlives the test
        pool = getattr(getattr(self.server, "_state", None), "thread_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)


@pytest.fixture
def fleet():
    f = Fleet()
    try:
        yield f
    finally:
        f.close()


def assert_same_segment(a: Segment, b: Segment) -> None:
    for name, arr in a.to_tensors().items():
        other = b.to_tensors()[name]
        assert other.dtype == arr.dtype and other.shape == arr.shape, name
        np.testing.assert_array_equal(other, arr, err_msg=name)


# ---- membership ------------------------------------------------------------------------------


def test_server_binds_loopback_and_refuses_other_hosts():
    with pytest.raises(ValueError, match="loopback"):
        start_grpc_server("0.0.0.0", 0, [], [SERVICE])


def test_health_check_reports_serving(fleet):
    health = health_pb2_grpc.HealthStub(fleet.channel)
    for name in (SERVICE, ""):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=RPC_TIMEOUT)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="rlfleet.v1.Nope"), timeout=RPC_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_register_returns_config_and_stable_index(fleet):
    stub = fleet.stub
    a = stub.Register(learner_pb2.RegisterRequest(client_id="actor-a", role="actor", host="h"), timeout=RPC_TIMEOUT)
    assert a.config_yaml == CONFIG_YAML  # the config as given, the run spec beside it
    assert registered_spec(a, "learner") == RUN_SPEC
    assert a.run_id == "run123"
    assert a.heartbeat_interval_ms == 250
    assert a.policy_version == -1  # nothing published yet
    b = stub.Register(learner_pb2.RegisterRequest(client_id="actor-b", role="actor"), timeout=RPC_TIMEOUT)
    inf = stub.Register(learner_pb2.RegisterRequest(client_id="inf-0", role="inference"), timeout=RPC_TIMEOUT)
    fleet.publisher.publish(5, b"w")
    again = stub.Register(learner_pb2.RegisterRequest(client_id="actor-a", role="actor"), timeout=RPC_TIMEOUT)
    assert (a.client_index, b.client_index, inf.client_index, again.client_index) == (0, 1, 0, 0)
    assert again.policy_version == 5
    # a restarted process registers its id again: it is told so (it then plays a new episode stream)
    assert (a.registrations, b.registrations, inf.registrations, again.registrations) == (0, 0, 0, 1)
    third = stub.Register(learner_pb2.RegisterRequest(client_id="actor-a", role="actor"), timeout=RPC_TIMEOUT)
    assert third.registrations == 2 and third.client_index == 0
    assert fleet.servicer.alive_clients("actor") == 2
    assert fleet.servicer.alive_clients("inference") == 1


def test_an_actor_that_reports_its_death_is_logged_and_frees_its_index(fleet, caplog):
    stub = fleet.stub

    def register(cid: str) -> int:
        req = learner_pb2.RegisterRequest(client_id=cid, role="actor")
        return stub.Register(req, timeout=RPC_TIMEOUT).client_index

    assert (register("a"), register("b")) == (0, 1)
    with caplog.at_level("WARNING", logger="rlfleet.learner.service"):
        stub.Heartbeat(
            learner_pb2.HeartbeatRequest(client_id="a", exit_cause="cannot make env 'x'"), timeout=RPC_TIMEOUT
        )
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "actor a (index 0) died: cannot make env 'x'"
    ]
    assert register("c") == 0  # the next actor takes the dead one's index
    assert register("d") == 2
    assert register("a") == 3  # the dead one back: its index was taken meanwhile


def test_heartbeat_says_stop_after_stop_event(fleet):
    stub = fleet.stub
    stub.Register(learner_pb2.RegisterRequest(client_id="a", role="actor"), timeout=RPC_TIMEOUT)
    fleet.publisher.publish(2, b"w")
    hb = stub.Heartbeat(learner_pb2.HeartbeatRequest(client_id="a", env_steps=123), timeout=RPC_TIMEOUT)
    assert hb.stop is False and hb.policy_version == 2
    assert fleet.servicer._clients["a"].env_steps == 123
    fleet.servicer.stop_event.set()
    hb = stub.Heartbeat(learner_pb2.HeartbeatRequest(client_id="a", env_steps=200), timeout=RPC_TIMEOUT)
    assert hb.stop is True


# ---- trajectories ----------------------------------------------------------------------------


def test_chunked_segment_is_accepted_and_queued_once(fleet):
    seg = make_segment(0)
    chunks = chunks_of(segment_bytes(seg.to_tensors()), "actor-a", 11, chunk_size=64)
    assert len(chunks) > 5  # really several chunks
    ack = fleet.push(chunks)
    assert ack.accepted and not ack.duplicate and ack.error == ""
    assert ack.segment_id == 11
    assert fleet.ingest.qsize() == 1 and fleet.ingest.accepted == 1

    item = fleet.ingest.get(timeout=1.0)
    assert (item.client_id, item.segment_id) == ("actor-a", 11)
    assert_same_segment(seg, item.segment)
    assert fleet.ingest.get(timeout=0.05) is None


def test_duplicate_push_is_acked_but_not_queued_twice(fleet):
    payload = segment_bytes(make_segment(0).to_tensors())
    first = fleet.push(chunks_of(payload, "actor-a", 7))
    assert first.accepted and not first.duplicate
    again = fleet.push(chunks_of(payload, "actor-a", 7, chunk_size=200))
    assert again.accepted and again.duplicate and again.segment_id == 7
    assert fleet.ingest.qsize() == 1 and fleet.ingest.duplicates == 1
    # the same segment id from another client is a different segment
    other = fleet.push(chunks_of(payload, "actor-b", 7))
    assert other.accepted and not other.duplicate
    assert fleet.ingest.qsize() == 2 and fleet.ingest.accepted == 2


def _garbage(seg_id):
    return chunks_of(b"\xff\xfe this is not a protobuf \x00\x01" * 3, "bad", seg_id)


def _gap(seg_id):
    chunks = chunks_of(segment_bytes(make_segment(0).to_tensors()), "bad", seg_id, chunk_size=64)
    return [chunks[0], *chunks[2:]]


def _missing_tail(seg_id):
    return chunks_of(segment_bytes(make_segment(0).to_tensors()), "bad", seg_id, chunk_size=64)[:-1]


def _wrong_bytes(seg_id):
    msg = codec.encode_map(make_segment(0).to_tensors())
    t = next(t for t in msg.tensors if t.name == "rewards")
    t.data = t.data[:-4]
    return chunks_of(msg.SerializeToString(), "bad", seg_id)


def _nan_states(seg_id):
    seg = make_segment(0)
    seg.obs["states"][1, 1, 2] = np.nan
    return chunks_of(segment_bytes(seg.to_tensors()), "bad", seg_id)


def _mismatched_shapes(seg_id):
    seg = make_segment(0, rewards=np.zeros((T, B + 1), np.float32))
    return chunks_of(segment_bytes(seg.to_tensors()), "bad", seg_id)


def _missing_field(seg_id):
    tensors = make_segment(0).to_tensors()
    del tensors["values"]
    return chunks_of(segment_bytes(tensors), "bad", seg_id)


def _mixed_ids(seg_id):
    chunks = chunks_of(segment_bytes(make_segment(0).to_tensors()), "bad", seg_id)
    chunks[1].segment_id = seg_id + 1
    return chunks


def _zero_chunks(seg_id):
    return [learner_pb2.TrajectoryChunk(client_id="bad", segment_id=seg_id, chunk_index=0, num_chunks=0)]


MALFORMED = {
    "garbage": (_garbage, "unreadable segment: .*TensorMap"),
    "chunk_gap": (_gap, "chunk 2 arrived where 1 was expected"),
    "missing_tail": (_missing_tail, r"got \d+ of \d+ chunks"),
    "wrong_byte_count": (_wrong_bytes, r"tensor 'rewards': 20 bytes of data .* \(expected 24\)"),
    "nan_states": (_nan_states, "obs.states contains NaN or inf"),
    "mismatched_shapes": (_mismatched_shapes, r"tensor 'rewards': shape \[3, 3\], expected \[3, 2\]"),
    "missing_field": (_missing_field, "missing tensor 'values'"),
    "mixed_segment_ids": (_mixed_ids, "must share segment_id"),
    "zero_chunks": (_zero_chunks, "num_chunks must be at least 1"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_push_is_rejected_and_server_keeps_serving(fleet, kind):
    build, pattern = MALFORMED[kind]
    ack = fleet.push(build(40))
    assert not ack.accepted and not ack.duplicate
    assert ack.error and re.search(pattern, ack.error), ack.error
    assert fleet.ingest.rejected == 1
    assert fleet.ingest.qsize() == 0

    good = fleet.push(chunks_of(segment_bytes(make_segment(1).to_tensors()), "good", 41))
    assert good.accepted and not good.duplicate
    assert fleet.ingest.qsize() == 1 and fleet.ingest.rejected == 1


def test_rejections_are_counted_and_a_rejected_id_can_be_resent(fleet):
    for i, (build, _) in enumerate(MALFORMED.values()):
        ack = fleet.push(build(100 + i))
        assert not ack.accepted
    assert fleet.ingest.rejected == len(MALFORMED)
    # a rejected segment was not remembered as seen: its corrected resend is accepted
    ack = fleet.push(chunks_of(segment_bytes(make_segment(0).to_tensors()), "bad", 101))
    assert ack.accepted and not ack.duplicate
    assert fleet.ingest.qsize() == 1


def test_empty_push_is_rejected(fleet):
    ack = fleet.push([])
    assert not ack.accepted and "empty push" in ack.error
    assert fleet.ingest.rejected == 1


# ---- weights ---------------------------------------------------------------------------------


def test_pull_weights_reassembles_with_checksum(fleet):
    data = os.urandom(10_000)
    fleet.publisher.publish(3, data)
    chunks = list(fleet.stub.PullWeights(learner_pb2.PullRequest(version=-1), timeout=RPC_TIMEOUT))
    assert len(chunks) == math.ceil(10_000 / 4096)  # the servicer's chunk_bytes
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert {c.num_chunks for c in chunks} == {len(chunks)}
    assert {c.version for c in chunks} == {3}
    assert {c.total_size for c in chunks} == {10_000}
    assert all(len(c.data) <= 4096 for c in chunks)
    assert {c.checksum for c in chunks} == {hashlib.sha256(data).hexdigest()}
    assert b"".join(c.data for c in chunks) == data


def test_pull_weights_refuses_tiny_chunks():
    """A puller asking for 1-byte chunks must not make the learner send one message per byte."""
    from rlfleet.learner.service import MIN_WEIGHT_CHUNK_BYTES

    servicer = LearnerServicer(CONFIG_YAML, "run", IngestQueue(maxsize=1), WeightPublisher(), chunk_bytes=1 << 20)
    data = os.urandom(300_000)
    servicer.weights.publish(1, data)
    for asked in (1, 64, MIN_WEIGHT_CHUNK_BYTES, 0):
        chunks = list(servicer.PullWeights(learner_pb2.PullRequest(version=-1, max_chunk_bytes=asked), None))
        assert len(chunks) <= math.ceil(300_000 / MIN_WEIGHT_CHUNK_BYTES), asked
        assert b"".join(c.data for c in chunks) == data


def test_pull_weights_chunk_size_is_capped_by_the_server(fleet):
    data = os.urandom(10_000)
    fleet.publisher.publish(1, data)
    chunks = list(
        fleet.stub.PullWeights(learner_pb2.PullRequest(version=-1, max_chunk_bytes=1 << 30), timeout=RPC_TIMEOUT)
    )
    assert len(chunks) == math.ceil(10_000 / 4096)  # the servicer's chunk_bytes
    assert b"".join(c.data for c in chunks) == data


def test_pull_weights_errors(fleet):
    with pytest.raises(grpc.RpcError) as info:
        list(fleet.stub.PullWeights(learner_pb2.PullRequest(version=-1), timeout=RPC_TIMEOUT))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    fleet.publisher.publish(2, b"abc")
    with pytest.raises(grpc.RpcError) as info:
        list(fleet.stub.PullWeights(learner_pb2.PullRequest(version=9), timeout=RPC_TIMEOUT))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "version 9" in info.value.details()


def test_watch_weights_announces_current_new_and_final(fleet):
    v1, v2 = b"first weights", b"second weights, longer"
    fleet.publisher.publish(1, v1)
    stream = fleet.stub.WatchWeights(learner_pb2.WatchRequest(subscriber_id="t", known_version=-1), timeout=RPC_TIMEOUT)
    try:
        first = next(stream)
        assert (first.version, first.final) == (1, False)
        assert first.checksum == hashlib.sha256(v1).hexdigest() and first.size_bytes == len(v1)

        fleet.publisher.publish(2, v2)
        second = next(stream)
        assert (second.version, second.final) == (2, False)
        assert second.checksum == hashlib.sha256(v2).hexdigest() and second.size_bytes == len(v2)

        fleet.publisher.finish()
        last = next(stream)
        assert last.final and last.version == 2
        with pytest.raises(StopIteration):
            next(stream)
    finally:
        stream.cancel()


def test_watch_weights_skips_versions_already_known(fleet):
    fleet.publisher.publish(4, b"x")
    stream = fleet.stub.WatchWeights(learner_pb2.WatchRequest(subscriber_id="t", known_version=4), timeout=RPC_TIMEOUT)
    try:
        publish = threading.Timer(0.2, fleet.publisher.publish, args=(5, b"y"))
        publish.start()
        nxt = next(stream)
        publish.join()
        assert nxt.version == 5 and not nxt.final
    finally:
        stream.cancel()


def test_retried_push_waiting_on_a_full_queue_is_queued_once():
    import threading

    from rlfleet.learner.ingest import IngestedSegment, IngestQueue

    q = IngestQueue(maxsize=1)
    assert q.put(IngestedSegment("other", 0, None), 1)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(q.put(IngestedSegment("a", 7, None), 5))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    assert q.get(1).client_id == "other"  # room for exactly one of the two racing pushes
    for t in threads:
        t.join(10)
    assert results == [True, True]
    got = [q.get(0.2) for _ in range(2)]
    assert [g.segment_id for g in got if g is not None] == [7]
    assert q.duplicates == 1 and q.accepted == 2


def test_unknown_heartbeat_ids_are_adopted_within_a_bound_and_forgotten(monkeypatch):
    from rlfleet.learner import service as service_mod

    servicer = LearnerServicer(CONFIG_YAML, "run", IngestQueue(maxsize=1), WeightPublisher())
    servicer.Register(learner_pb2.RegisterRequest(client_id="real", role="actor"), None)
    for i in range(3000):  # ids nobody registered
        servicer.Heartbeat(learner_pb2.HeartbeatRequest(client_id=f"fake{i}"), None)
    assert servicer.alive_clients("actor") == 1 + service_mod.MAX_ADOPTED_CLIENTS
    assert servicer.rejected_calls() == {"unknown_client": 3000 - service_mod.MAX_ADOPTED_CLIENTS}
    assert servicer.rejected_requests() == {}  # not counted as rejected segments
    monkeypatch.setattr(service_mod, "FORGET_CLIENT_S", 0.0)  # everyone silent long enough: forgotten
    servicer.Heartbeat(learner_pb2.HeartbeatRequest(client_id="after-restart"), None)
    assert "after-restart" in servicer._clients and len(servicer._clients) == 1


class _Ctx:
    def is_active(self):
        return True


def test_a_push_is_refused_as_soon_as_it_passes_the_size_limit():
    ingest = IngestQueue(maxsize=1)
    servicer = LearnerServicer(CONFIG_YAML, "run", ingest, WeightPublisher(), max_segment_bytes=10_000)
    read = []

    def chunks():
        for i in range(1_000_000):  # a 1 GB push, declared up front
            read.append(i)
            yield learner_pb2.TrajectoryChunk(
                client_id="big", segment_id=1, chunk_index=i, num_chunks=1_000_000, payload=b"\0" * 1000
            )

    ack = servicer.PushTrajectory(chunks(), _Ctx())
    assert not ack.accepted and "larger than 10000" in ack.error
    assert len(read) <= 11 and ingest.rejected_by_reason() == {"too_large": 1}


def test_the_segment_limit_fits_the_runs_segments():
    from rlfleet.learner.service import segment_byte_limit

    seg = make_segment()
    size = len(segment_bytes(seg.to_tensors()))
    limit = segment_byte_limit({"states": ((S,), "float32")}, T, B, K, D)
    assert size < limit <= 512 * 1024 * 1024
    big = segment_byte_limit({"main_images": ((224, 224, 3), "uint8")}, 64, 256, 8, 7)
    assert big == 512 * 1024 * 1024  # never above the hard cap


def test_poisoned_life_reports_and_huge_client_ids_are_refused_and_counted(tmp_path):
    """Was: one heartbeat put 2^62 into actor_stopped; a 1 MiB client id was kept for every Register."""
    from rlfleet.learner.losses import LossLedger, read_ledger

    ledger = LossLedger(tmp_path, life_slack=100, segment_env_steps=T * B * K)
    ledger.start()
    f = Fleet()
    f.servicer.on_life_ended, f.servicer.on_refused_push = ledger.life_ended, ledger.refused_push
    f.ingest._on_accept, f.ingest._seen_before = ledger.accepted_segment, ledger.seen_before
    try:
        life = 0xBADBAD
        assert f.push(chunks_of(segment_bytes(make_segment().to_tensors()), "a0", (life << 32) + 1)).accepted
        f.stub.Register(learner_pb2.RegisterRequest(client_id="a0", role="actor"), timeout=RPC_TIMEOUT)
        poisoned = [
            learner_pb2.LifeReport(life=life, env_steps=2**62),
            learner_pb2.LifeReport(
                life=life, env_steps=10, accepted_env_steps=-(2**62), rejected_env_steps=-7, crashed=True
            ),
        ]
        for report in poisoned:  # answered (a real actor would otherwise retry forever), not added
            f.stub.Heartbeat(learner_pb2.HeartbeatRequest(client_id="a0", life=life, ended=report), timeout=RPC_TIMEOUT)
        assert f.servicer.rejected_calls() == {"bad_life_report": 2}
        assert ledger.by_cause() == {}
        honest = learner_pb2.LifeReport(life=life, env_steps=T * B * K + 50, accepted_env_steps=T * B * K)
        f.stub.Heartbeat(learner_pb2.HeartbeatRequest(client_id="a0", life=life, ended=honest), timeout=RPC_TIMEOUT)
        assert read_ledger(tmp_path)["lost"] == {"actor_stopped": 50, "rejected_segments": 0}

        huge = "x" * (1 << 20)
        for call in (
            lambda: f.stub.Register(learner_pb2.RegisterRequest(client_id=huge, role="actor"), timeout=RPC_TIMEOUT),
            lambda: f.stub.Heartbeat(learner_pb2.HeartbeatRequest(client_id=huge), timeout=RPC_TIMEOUT),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ack = f.push(chunks_of(segment_bytes(make_segment().to_tensors()), huge, 5, chunk_size=1 << 21))
        assert not ack.accepted and "client_id" in ack.error
        assert f.servicer.rejected_calls()["bad_client_id"] == 2 and f.servicer.rejected_requests() == {
            "bad_client_id": 1
        }
        assert all(len(c) <= 128 for c in f.servicer._clients)
    finally:
        f.close()
        ledger.close()
