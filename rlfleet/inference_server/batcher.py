"""Dynamic batching: take what has arrived, up to max_batch rows or max_wait_ms after the first
(the default 0: what has arrived, no wait; requests that arrive while the policy runs form the
next batch, so batches grow with the load).

It never waits for a fixed number of actors, so an actor that dies cannot stall the others.
With a `pump` (the ZeroMQ front end's receive loop), waiting for requests means receiving them
on the serving thread itself: a request then reaches the policy without a hand-off between
threads, and its answer leaves the same way.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class InferenceRequest:
    obs: dict[str, np.ndarray]  # the keys the policy reads, [n, ...] each (validated copies)
    deterministic: bool
    respond: Callable[[dict[str, np.ndarray], int], None]  # (outputs rows, policy version)
    fail: Callable[[str], None]
    arrived: float = field(default_factory=time.monotonic)
    rows: int = field(init=False)  # read several times per batch: counted once

    def __post_init__(self) -> None:
        self.rows = int(next(iter(self.obs.values())).shape[0])


MAX_PENDING_BYTES = 512 * 1024 * 1024  # observation bytes waiting for a batch, all requests together


class DynamicBatcher:
    def __init__(
        self,
        max_batch: int,
        max_wait_ms: float,
        max_pending: int = 4096,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        pump: Callable[[float], None] | None = None,
    ):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self._q: queue.Queue[InferenceRequest] = queue.Queue(maxsize=max_pending)
        self._carry: InferenceRequest | None = None
        self.max_pending_bytes = max_pending_bytes
        self._bytes = 0  # held by queued requests (each is a private copy): bounded, not just counted
        self._bytes_lock = threading.Lock()
        self.overloaded = 0  # requests refused because max_pending (or max_pending_bytes) were already waiting
        # Waits up to t seconds for messages and submits the requests among them (on the calling thread).
        self.pump = pump
        # Called after a request is queued, e.g. to wake a pump that waits on a socket.
        self.on_submit: Callable[[], None] | None = None

    @staticmethod
    def _nbytes(req: InferenceRequest) -> int:
        return sum(int(getattr(v, "nbytes", 0)) for v in req.obs.values())

    def pending_bytes(self) -> int:
        return self._bytes

    def submit(self, req: InferenceRequest) -> None:
        size = self._nbytes(req)
        with self._bytes_lock:
            fits = self._bytes + size <= self.max_pending_bytes or self._bytes == 0
            if fits:
                self._bytes += size
        if not fits:
            self.overloaded += 1
            req.fail("inference server overloaded: too many pending observation bytes")
            return
        try:
            self._q.put_nowait(req)
        except queue.Full:
            self._taken(req)
            self.overloaded += 1
            req.fail("inference server overloaded: too many pending requests")
            return
        if self.on_submit is not None:
            self.on_submit()

    def _taken(self, req: InferenceRequest) -> None:
        with self._bytes_lock:
            self._bytes -= self._nbytes(req)

    def pending(self) -> int:
        return self._q.qsize() + (self._carry is not None)

    def next_batch(self, timeout: float) -> list[InferenceRequest]:
        """Block up to `timeout` for a first request, then gather more for at most max_wait."""
        if self._carry is not None:
            first, self._carry = self._carry, None
        else:
            try:
                first = self._get(timeout)
            except queue.Empty:
                return []
            self._taken(first)
        batch, rows = [first], first.rows
        deadline = time.monotonic() + self.max_wait
        while rows < self.max_batch:
            try:
                req = self._get(deadline - time.monotonic())
            except queue.Empty:
                break
            self._taken(req)
            if rows + req.rows > self.max_batch:
                self._carry = req
                break
            batch.append(req)
            rows += req.rows
        return batch

    def _get(self, timeout: float) -> InferenceRequest:
        """The next queued request within `timeout` (<= 0: only what has already arrived); raises queue.Empty."""
        if self.pump is None:
            return self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
        deadline = time.monotonic() + timeout
        while True:
            if self._q.qsize():  # cheaper than get_nowait's exception when nothing is queued
                return self._q.get_nowait()
            remaining = deadline - time.monotonic()
            self.pump(max(remaining, 0.0))  # messages that are not requests (attach, ...) return early
            if remaining <= 0:
                return self._q.get_nowait()
