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
