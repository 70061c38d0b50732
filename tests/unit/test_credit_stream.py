"""The credit protocol over real gRPC on loopback: the actor's CreditStream against the learner's
LearnerServicer.Credits (rlfleet.learner.pacing)."""

from __future__ import annotations

import threading
import time

import pytest

from rlfleet.actors.learner_client import CreditStream
from rlfleet.learner.ingest import IngestQueue
from rlfleet.learner.pacing import SampleCredits
from rlfleet.learner.service import LearnerServicer
from rlfleet.learner.weight_publisher import WeightPublisher
from rlfleet.wire.gen import learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel, start_grpc_server

SERVICE = "rlfleet.v1.LearnerService"


class PacedLearner:
    def __init__(self, batch: int, max_lag: int):
        self.credits = SampleCredits(batch, max_lag)
        self.ingest = IngestQueue(maxsize=8)
        self.publisher = WeightPublisher()
        self.servicer = LearnerServicer("runner: {}\n", "run", self.ingest, self.publisher, credits=self.credits)
        self.server, port = start_grpc_server(
            "127.0.0.1",
            0,
            [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(self.servicer, s)],
            [SERVICE],
            max_workers=8,
        )
        self.channel = make_channel(f"127.0.0.1:{port}")
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)

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
