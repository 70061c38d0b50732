"""Dynamic batching: take what has arrived, up to max_batch rows or max_wait_ms after the first.

It never waits for a fixed number of actors, so an actor that dies cannot stall the others.
"""
from __future__ import annotations

import queue
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

    @property
    def rows(self) -> int:
        return int(next(iter(self.obs.values())).shape[0])


class DynamicBatcher:
    def __init__(self, max_batch: int, max_wait_ms: float, max_pending: int = 4096):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self._q: queue.Queue[InferenceRequest] = queue.Queue(maxsize=max_pending)
        self._carry: InferenceRequest | None = None
        self.overloaded = 0  # requests refused because max_pending were already waiting

    def submit(self, req: InferenceRequest) -> None:
        try:
            self._q.put_nowait(req)
        except queue.Full:
            self.overloaded += 1
            req.fail("inference server overloaded: too many pending requests")

    def pending(self) -> int:
        return self._q.qsize() + (self._carry is not None)

    def next_batch(self, timeout: float) -> list[InferenceRequest]:
        """Block up to `timeout` for a first request, then gather more for at most max_wait."""
        if self._carry is not None:
            first, self._carry = self._carry, None
        else:
            try:
                first = self._q.get(timeout=timeout)
            except queue.Empty:
                return []
        batch, rows = [first], first.rows
        deadline = time.monotonic() + self.max_wait
        while rows < self.max_batch:
            try:
                remaining = deadline - time.monotonic()
                req = self._q.get_nowait() if remaining <= 0 else self._q.get(timeout=remaining)
            except queue.Empty:
                break
            if rows + req.rows > self.max_batch:
                self._carry = req
                break
            batch.append(req)
            rows += req.rows
        return batch
