"""The credit protocol over real gRPC on loopback: the actor's CreditStream against the learner's
LearnerServicer.Credits (rlfleet.learner.pacing)."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from test_learner_service import B, T, chunks_of, make_segment, segment_bytes

from rlfleet.actors.learner_client import CreditStream
from rlfleet.learner.ingest import IngestQueue
from rlfleet.learner.pacing import SampleCredits
from rlfleet.learner.service import LearnerServicer
from rlfleet.learner.weight_publisher import WeightPublisher
from rlfleet.wire import codec
from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel, start_grpc_server

SERVICE = "rlfleet.v1.LearnerService"


def refuse_marked(segment) -> None:
    if int(segment.task_ids[0]) == 99:  # the tests' mark of a segment the learner rejects
        raise codec.WireFormatError("marked bad", reason="bad_schema")


class PacedLearner:
    def __init__(self, batch: int, max_lag: int, segment_samples: int = 0):
        self.credits = SampleCredits(batch, max_lag)
        # as the learner does: a queued segment's reservation ends (Learner._queued)
        self.ingest = IngestQueue(
            maxsize=8,
            on_queued=lambda it: self.credits.arrived(it.client_id, it.segment.num_steps * it.segment.num_envs),
        )
        self.publisher = WeightPublisher()
        self.servicer = LearnerServicer(
            "runner: {}\n",
            "run",
            self.ingest,
            self.publisher,
            credits=self.credits,
            check_segment=refuse_marked,
            segment_samples=segment_samples,
        )
        self.server, port = start_grpc_server(
            "127.0.0.1",
            0,
            [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(self.servicer, s)],
            [SERVICE],
            max_workers=8,
        )
        self.channel = make_channel(f"127.0.0.1:{port}")
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)
        self.stub.Register(learner_pb2.RegisterRequest(client_id="actor0", role="actor"), timeout=10)

    def close(self):
        self.servicer.stop_event.set()
        self.publisher.finish()
        self.channel.close()
        self.server.stop(grace=None).wait(5)
        pool = getattr(getattr(self.server, "_state", None), "thread_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)


@pytest.fixture
def learner():
    paced = PacedLearner(batch=10, max_lag=2)  # 20 samples owed at most (no version told)
    try:
        yield paced
    finally:
        paced.close()


def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_an_actor_waits_for_room_and_starts_when_an_update_makes_it(learner):
    stream = CreditStream(learner.stub, "actor0")
    never = lambda: False  # noqa: E731
    stream.wait(10, never)
    stream.wait(10, never)  # 20 owed: the limit
    assert learner.credits.owed() == 20
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (stream.wait(10, never), done.set()))
    waiter.start()
    until(lambda: learner.credits.waits >= 1)  # asked, and found no room
    assert not done.is_set()
    learner.credits.arrived("actor0", 10)
    learner.credits.trained(10)  # an update: room for one more segment
    waiter.join(timeout=30)
    assert done.is_set() and learner.credits.owed() == 20
    stream.close()
    until(lambda: learner.credits.owed() == 0)  # the stream's reservations end with it (none untrained)


def test_a_stopping_learner_ends_the_wait(learner):
    stream = CreditStream(learner.stub, "actor0")
    stream.wait(20, lambda: False)
    result = []
    waiter = threading.Thread(target=lambda: result.append(stream.wait(10, lambda: False)))
    waiter.start()
    until(lambda: learner.credits.waits >= 1)
    learner.servicer.stop_event.set()
    waiter.join(timeout=30)
    assert not waiter.is_alive() and stream.stop
    stream.close()


def test_the_actor_side_stop_ends_the_wait(learner):
    stream = CreditStream(learner.stub, "actor0")
    stream.wait(20, lambda: False)
    stop = threading.Event()
    waiter = threading.Thread(target=lambda: stream.wait(10, stop.is_set))
    waiter.start()
    until(lambda: learner.credits.waits >= 1)
    stop.set()  # checked at each "not yet" reply, one a second
    waiter.join(timeout=30)
    assert not waiter.is_alive() and not stream.stop
    stream.close()


def test_a_learner_without_flow_control_grants_every_credit_at_once():
    unpaced = PacedLearner(batch=1, max_lag=0)
    unpaced.servicer.credits = None  # learner.flow_control: drop
    try:
        stream = CreditStream(unpaced.stub, "actor0")
        for _ in range(5):
            stream.wait(1000, lambda: False)
        assert stream.enabled and not stream.stop
        stream.close()
    finally:
        unpaced.close()


def push(learner, payload: bytes, segment_id: int) -> learner_pb2.PushAck:
    return learner.stub.PushTrajectory(iter(chunks_of(payload, "actor0", segment_id)), timeout=10)


def test_rejected_pushes_give_their_reservations_back_once():
    paced = PacedLearner(batch=T * B, max_lag=1, segment_samples=T * B)  # one segment owed at most
    bad = segment_bytes(make_segment(1, task_ids=np.array([99, 1], np.int64)).to_tensors())
    good = segment_bytes(make_segment(2).to_tensors())
    stream = CreditStream(paced.stub, "actor0")
    deadline = time.monotonic() + 30
    too_long = lambda: time.monotonic() > deadline  # noqa: E731
    try:
        for i in range(4):  # every grant is followed by a rejected push: decoded, then undecodable
            stream.wait(T * B, too_long)
            assert paced.credits.held("actor0") == T * B, f"grant {i} never came"
            ack = push(paced, bad if i % 2 == 0 else b"\xff" * 40, segment_id=i)
            assert not ack.accepted
            assert paced.credits.owed() == 0  # the reservation went back with the rejection
        stream.wait(T * B, too_long)
        assert not push(paced, bad, segment_id=0).accepted  # the same rejected segment again
        assert paced.credits.held("actor0") == T * B  # given back once, not twice
        assert push(paced, good, segment_id=10).accepted
        ack = push(paced, good, segment_id=10)  # re-sent after a lost ack
        assert ack.accepted and ack.duplicate
        assert paced.credits.held("actor0") == 0 and paced.credits.owed() == T * B  # counted once
        assert paced.ingest.rejected == 5
    finally:
        stream.close()
        paced.close()


def credit_call(learner, client_id: str, samples: int) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        list(learner.stub.Credits(iter([learner_pb2.CreditRequest(client_id=client_id, samples=samples)]), timeout=10))
    return err.value.code()


def test_credit_requests_need_a_registered_id_and_at_most_a_segment():
    paced = PacedLearner(batch=10, max_lag=1, segment_samples=T * B)
    try:
        assert credit_call(paced, "actor0", T * B + 1) == grpc.StatusCode.INVALID_ARGUMENT
        assert credit_call(paced, "actor0", 10**12) == grpc.StatusCode.INVALID_ARGUMENT
        assert credit_call(paced, "stranger", 1) == grpc.StatusCode.FAILED_PRECONDITION
        refused = paced.servicer.rejected_calls()
        assert refused["credit_too_large"] == 2 and refused["unknown_client"] == 1
        until(lambda: paced.credits.owed() == 0)  # nothing reserved by the refused calls
        CreditStream(paced.stub, "actor0").wait(T * B, lambda: False)  # a segment's worth is granted
        assert paced.credits.held("actor0") == T * B
    finally:
        paced.close()


def test_a_credit_stream_that_keeps_failing_runs_unpaced(learner, caplog):
    stream = CreditStream(learner.stub, "never-registered", give_up_s=0.5, log_every_s=0.2)
    with caplog.at_level("WARNING", logger="rlfleet.actors.learner_client"):
        stream.wait(10, lambda: False)  # refused each time: returns after give_up_s, unpaced
    assert not stream.enabled and not stream.stop
    assert "FAILED_PRECONDITION" in caplog.text and "runs unpaced" in caplog.text
    stream.wait(10, lambda: False)  # no longer asks
    assert learner.credits.owed() == 0
