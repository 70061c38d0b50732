"""A thread pool that gives its threads back: the gRPC servers' executor.

`concurrent.futures.ThreadPoolExecutor` starts a thread per call until it reaches `max_workers`
and keeps every one of them until shutdown. A gRPC server's pool is sized for its whole stream
budget (hundreds), so one burst of calls left a server holding that many idle threads for the
rest of its life. `ShrinkingThreadPool` starts threads the same way (one per call when none is
idle, up to `max_workers`) and ends a thread that has waited `idle_s` without work.
"""

from __future__ import annotations

import queue
import threading
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
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0  # alive
        self._idle = 0  # waiting for work
        self._shutdown = False

    @property
    def threads(self) -> int:
        return self._threads

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future:
        future: futures.Future = futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.put((future, fn, args, kwargs))
            # Items not yet taken by an idle thread need a new one (the check and the exit
            # decision in _run are both under this lock, so no item is left without a thread).
            if self._work.qsize() > self._idle and self._threads < self.max_workers:
                self._threads += 1
                threading.Thread(target=self._run, name=f"{self._name}-{self._threads}", daemon=True).start()
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                item = self._work.get(timeout=self.idle_s)
            except queue.Empty:
                item = None
            with self._lock:
                self._idle -= 1
                if item is None:
                    if self._work.empty() or self._shutdown:
                        self._threads -= 1
                        return
                    continue
            if item is _STOP:
                with self._lock:
                    self._threads -= 1
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            del item, future, fn, args, kwargs  # a finished call's objects do not wait for the next

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = self._threads
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    item[0].cancel()
        for _ in range(threads):
            self._work.put(_STOP)


_STOP = object()
