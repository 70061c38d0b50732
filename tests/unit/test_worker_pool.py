"""The gRPC servers' thread pool starts threads as calls need them and ends idle ones."""

from __future__ import annotations

import threading
import time

import pytest

from rlfleet.wire.worker_pool import ShrinkingThreadPool


def test_threads_grow_to_the_cap_run_everything_and_end_when_idle():
    pool = ShrinkingThreadPool(8, idle_s=0.2)
    gate = threading.Event()
    futures = [pool.submit(lambda i=i: gate.wait(30) and i) for i in range(20)]
    deadline = time.monotonic() + 30
    while pool.threads < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.threads == 8  # never more than the cap, the rest queue
    gate.set()
    assert [f.result(timeout=30) for f in futures] == list(range(20))
    deadline = time.monotonic() + 30
    while pool.threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.threads == 0
    assert pool.submit(lambda: 7).result(timeout=30) == 7  # and start again
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=30)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: 1)


def test_calls_queued_while_threads_time_out_all_run():
    """Submissions racing idle threads' exits (idle_s tiny): no call is left without a thread."""
    pool = ShrinkingThreadPool(4, idle_s=0.001)
    done: list = []

    def feed(k: int) -> None:
        for i in range(300):
            done.append(pool.submit(lambda i=i: i + k))
            if i % 50 == 0:
                time.sleep(0.002)  # let threads go idle and end in between

    feeders = [threading.Thread(target=feed, args=(k,)) for k in range(4)]
    for t in feeders:
        t.start()
    for t in feeders:
        t.join()
    assert len([f.result(timeout=30) for f in done]) == 1200
    assert pool.threads <= 4
