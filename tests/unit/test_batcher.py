import threading
import time

import numpy as np
import pytest

from rlfleet.inference_server.batcher import DynamicBatcher, InferenceRequest


class Recorder:
    """Collects what the batcher (or a runner) tells one request."""

    def __init__(self):
        self.failures: list[str] = []
        self.responses: list[tuple[dict, int]] = []

    def respond(self, out, version):
        self.responses.append((out, version))

    def fail(self, msg):
        self.failures.append(msg)


def make_req(rows: int, tag: float = 0.0, rec: Recorder | None = None) -> InferenceRequest:
    rec = rec or Recorder()
    states = np.full((rows, 3), tag, np.float32)
    return InferenceRequest(obs={"states": states}, deterministic=False, respond=rec.respond, fail=rec.fail)


def tags(batch):
    return [float(r.obs["states"][0, 0]) for r in batch]


def test_rejects_max_batch_below_one():
    with pytest.raises(ValueError, match="max_batch"):
        DynamicBatcher(max_batch=0, max_wait_ms=1.0)


def test_gathers_up_to_max_batch_rows_without_waiting_when_full():
    b = DynamicBatcher(max_batch=3, max_wait_ms=2000.0)
    for i in range(6):
        b.submit(make_req(1, tag=i))
    assert b.pending() == 6
    t0 = time.monotonic()
    first = b.next_batch(timeout=1.0)
    # a full batch returns at once, without waiting for max_wait
    assert time.monotonic() - t0 < 1.0
    assert tags(first) == [0, 1, 2]
    assert sum(r.rows for r in first) == 3
    second = b.next_batch(timeout=1.0)
    assert tags(second) == [3, 4, 5]
    assert b.pending() == 0
    assert time.monotonic() - t0 < 1.5


def test_overflowing_request_is_carried_to_next_batch_in_order():
    b = DynamicBatcher(max_batch=4, max_wait_ms=20.0)
    sizes = [2, 1, 3, 1, 4]
    for i, n in enumerate(sizes):
        b.submit(make_req(n, tag=i))

    first = b.next_batch(timeout=1.0)
    assert tags(first) == [0, 1]  # 2+1 rows; the 3-row request would make 6 > 4
    # the carried request is still pending, not lost
    assert b.pending() == 3

    second = b.next_batch(timeout=1.0)
    assert tags(second) == [2, 3]  # the carry leads the next batch, order kept
    assert [r.rows for r in second] == [3, 1]

    third = b.next_batch(timeout=1.0)
    assert tags(third) == [4] and third[0].rows == 4
    assert b.pending() == 0
    assert b.next_batch(timeout=0.01) == []


def test_request_larger_than_max_batch_is_served_alone():
    b = DynamicBatcher(max_batch=2, max_wait_ms=20.0)
    b.submit(make_req(5, tag=0))
    b.submit(make_req(1, tag=1))
    assert tags(b.next_batch(timeout=1.0)) == [0]
    assert tags(b.next_batch(timeout=1.0)) == [1]


def test_returns_after_max_wait_with_a_partial_batch():
    max_wait_ms = 60.0
    b = DynamicBatcher(max_batch=100, max_wait_ms=max_wait_ms)
    b.submit(make_req(2, tag=7))
    t0 = time.monotonic()
    batch = b.next_batch(timeout=5.0)
    elapsed = time.monotonic() - t0
    assert tags(batch) == [7]
    # waited for more rows for about max_wait, and not for the 5 s timeout
    assert elapsed >= 0.9 * max_wait_ms / 1000.0
    assert elapsed < 2.0


def test_requests_arriving_within_max_wait_join_the_batch():
    b = DynamicBatcher(max_batch=100, max_wait_ms=3000.0)
    b.submit(make_req(1, tag=0))

    def late():
        time.sleep(0.05)
        b.submit(make_req(1, tag=1))
        b.submit(make_req(98, tag=2))  # fills the batch: the batcher must return at once

    th = threading.Thread(target=late)
    th.start()
    try:
        t0 = time.monotonic()
        batch = b.next_batch(timeout=5.0)
        elapsed = time.monotonic() - t0
    finally:
        th.join(5)
    assert tags(batch) == [0, 1, 2]
    assert sum(r.rows for r in batch) == 100
    assert elapsed < 1.5  # returned when full, well before the 3 s max_wait


def test_timeout_with_nothing_pending_returns_empty():
    b = DynamicBatcher(max_batch=8, max_wait_ms=1.0)
    t0 = time.monotonic()
    assert b.next_batch(timeout=0.1) == []
    elapsed = time.monotonic() - t0
    assert 0.09 <= elapsed < 2.0


def test_overload_fails_the_request_with_a_clear_message():
    b = DynamicBatcher(max_batch=8, max_wait_ms=1.0, max_pending=2)
    recs = [Recorder() for _ in range(4)]
    for i, rec in enumerate(recs):
        b.submit(make_req(1, tag=i, rec=rec))
    assert recs[0].failures == [] and recs[1].failures == []
    for rec in recs[2:]:
        assert len(rec.failures) == 1
        assert "overloaded" in rec.failures[0] and "pending" in rec.failures[0]
    assert b.pending() == 2
    assert tags(b.next_batch(timeout=1.0)) == [0, 1]
    # once drained, new requests are accepted again
    ok = Recorder()
    b.submit(make_req(1, tag=9, rec=ok))
    assert ok.failures == []
    assert tags(b.next_batch(timeout=1.0)) == [9]


def test_pending_requests_are_bounded_by_bytes_not_only_by_count():
    b = DynamicBatcher(max_batch=64, max_wait_ms=1.0, max_pending=1000, max_pending_bytes=10_000)
    recs = [Recorder() for _ in range(10)]
    for rec in recs:
        b.submit(make_req(100, rec=rec))  # 1,200 bytes each
    assert [bool(r.failures) for r in recs] == [False] * 8 + [True] * 2
    assert "bytes" in recs[-1].failures[0] and b.overloaded == 2 and b.pending_bytes() == 8 * 1200
    assert len(b.next_batch(timeout=1.0)) == 1 and b.pending_bytes() == 7 * 1200  # taken: room again
    late = Recorder()
    b.submit(make_req(100, rec=late))
    assert not late.failures and b.pending() == 8


class ScriptedPump:
    """Stands in for the ZeroMQ front end: each call delivers the next scripted arrival (or
    nothing) and records how long it was allowed to wait."""

    def __init__(self, batcher: DynamicBatcher, arrivals: list[list[InferenceRequest]]):
        self.batcher, self.arrivals, self.waits = batcher, list(arrivals), []

    def __call__(self, timeout: float) -> None:
        self.waits.append(timeout)
        if self.arrivals:
            for req in self.arrivals.pop(0):
                self.batcher.submit(req)
        else:
            time.sleep(timeout)


def test_pump_receives_on_the_calling_thread_and_gathers_until_max_batch():
    b = DynamicBatcher(max_batch=4, max_wait_ms=2000.0)
    # the second arrival is not a request (an attach message): the wait goes on
    pump = ScriptedPump(b, [[make_req(1, tag=0)], [], [make_req(2, tag=1)], [make_req(1, tag=2), make_req(1, tag=3)]])
    b.pump = pump
    batch = b.next_batch(timeout=1.0)
    assert tags(batch) == [0, 1, 2]
    assert sum(r.rows for r in batch) == 4
    assert b.pending() == 1  # the request that did not fit waits for the next batch
    assert len(pump.waits) == 4 and all(0 <= w <= 2.0 for w in pump.waits)


def test_pump_gives_up_at_max_wait_and_at_the_first_request_timeout():
    b = DynamicBatcher(max_batch=8, max_wait_ms=30.0)
    pump = ScriptedPump(b, [[make_req(1, tag=7)]])
    b.pump = pump
    t0 = time.monotonic()
    assert tags(b.next_batch(timeout=1.0)) == [7]
    assert time.monotonic() - t0 >= 0.03  # waited out max_wait for more
    t0 = time.monotonic()
    assert b.next_batch(timeout=0.05) == []
    assert 0.05 <= time.monotonic() - t0 < 1.0


def test_on_submit_runs_after_a_request_is_queued_only():
    b = DynamicBatcher(max_batch=8, max_wait_ms=1.0, max_pending=1)
    woken = []
    b.on_submit = lambda: woken.append(b.pending())
    b.submit(make_req(1))
    rec = Recorder()
    b.submit(make_req(1, rec=rec))  # refused: the queue is full
    assert woken == [1] and rec.failures


def test_max_wait_zero_takes_what_has_arrived_and_never_waits_for_more():
    # greedy batching (the default): everything queued joins, up to max_batch; a lone request
    # leaves at once, however far below max_batch
    b = DynamicBatcher(max_batch=8, max_wait_ms=0.0)
    for i in range(3):
        b.submit(make_req(2, tag=i))
    assert tags(b.next_batch(timeout=1.0)) == [0, 1, 2]
    b.submit(make_req(1, tag=7))
    late = threading.Timer(0.5, lambda: b.submit(make_req(1, tag=8)))
    late.start()
    t0 = time.monotonic()
    assert tags(b.next_batch(timeout=1.0)) == [7]
    assert time.monotonic() - t0 < 0.5  # did not wait for the request 0.5 s later
    late.join()
    assert tags(b.next_batch(timeout=1.0)) == [8]
