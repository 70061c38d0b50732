"""A thread pool that gives its threads back: the gRPC servers' executor.

`concurrent.futures.ThreadPoolExecutor` starts a thread per call until it reaches `max_workers`
and keeps every one of them until shutdown. A gRPC server's pool is sized for its whole stream
budget (hundreds), so one burst of calls left a server holding that many idle threads for the
rest of its life. `ShrinkingThreadPool` starts threads the same way (one per call when none is
idle, up to `max_workers`) and ends a thread that has waited `idle_s` without work.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from typing import Any


class ShrinkingThreadPool(futures.Executor):
    """At most `max_workers` threads; a thread idle for `idle_s` seconds exits."""

    def __init__(self, max_workers: int, idle_s: float = 10.0, name: str = "grpc-worker"):
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        self.idle_s = idle_s
        self._name = name
        # Work, the idle count and the exit decision share one lock, so a call queued while a
        # thread is timing out is never left without a thread.
        self._work: deque[tuple[futures.Future, Callable[..., Any], tuple, dict]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._threads = 0  # alive
        self._idle = 0  # waiting for work
        self._shutdown = False

    @property
    def threads(self) -> int:
        return self._threads

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future:
        future: futures.Future = futures.Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.append((future, fn, args, kwargs))
            # Queued calls beyond the idle threads (each of which takes one) need new threads.
            if len(self._work) > self._idle and self._threads < self.max_workers:
                self._threads += 1
                threading.Thread(target=self._run, name=f"{self._name}-{self._threads}", daemon=True).start()
            else:
                self._cond.notify()
        return future

    def _take(self) -> tuple[futures.Future, Callable[..., Any], tuple, dict] | None:
        """The next call, or None when this thread should end (idle too long, or shut down)."""
        with self._cond:
            deadline = time.monotonic() + self.idle_s
            while not self._work:
                left = deadline - time.monotonic()
                if self._shutdown or left <= 0:
                    self._threads -= 1
                    return None
                self._idle += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._idle -= 1
            return self._work.popleft()

    def _run(self) -> None:
        while (item := self._take()) is not None:
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del item, future, fn, args, kwargs  # a finished call's objects do not wait for the next

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; idle threads end now, busy ones after their call (not waited for)."""
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._work:
                    self._work.popleft()[0].cancel()
            self._cond.notify_all()
