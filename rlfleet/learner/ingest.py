"""The learner's bounded ingest queue: back-pressure, de-duplication and rejection counts.

Queued segments leave oldest policy first (the lowest version that acted in them; arrival order
among equals): a row's deadline is its acting version + `max_policy_lag`, and taking the earliest
deadline first keeps a segment that took long to step (an actor starved of CPU among many)
from queueing behind newer ones until its first rows are too old to train. With one actor, or
actors that keep pace, versions arrive in order and this is arrival order.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from rlfleet.wire.segment import Segment


@dataclass
class IngestedSegment:
    client_id: str
    segment_id: int
    segment: Segment


def _env_steps(item: IngestedSegment) -> int:
    return int(getattr(item.segment, "env_steps", 0))  # tests may queue placeholder segments


def _oldest_version(item: IngestedSegment) -> int:
    versions = getattr(item.segment, "versions", None)  # placeholders: none, so arrival order
    return int(versions.min()) if versions is not None and len(versions) else 0


class IngestQueue:
    """A full queue blocks the pushing RPC, which blocks the actor: a slow learner slows actors."""

    def __init__(
        self,
        maxsize: int,
        remember: int = 4096,
        on_accept: Callable[[str, int, int], None] | None = None,
        seen_before: Callable[[str, int], bool] | None = None,
        on_queued: Callable[[IngestedSegment], None] | None = None,
    ):
        # (oldest acting version, arrival number, segment): earliest deadline first, then FIFO
        self._q: queue.PriorityQueue[tuple[int, int, IngestedSegment]] = queue.PriorityQueue(maxsize=maxsize)
        self._arrivals = itertools.count()
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._inflight: dict[tuple[str, int], threading.Event] = {}
        self._remember = remember
        self._lock = threading.Lock()
        self.accepted = 0
        self.duplicates = 0
        self.rejected = 0
        self._rejected_by: Counter[str] = Counter()
        self.by_client: dict[str, int] = {}
        self.accepted_env_steps = 0  # simulator steps in accepted segments (each counted once)
        self.consumed = 0  # segments handed to the trainer by get()
        self.consumed_env_steps = 0
        # the run's loss ledger: told (client, segment id, env steps) of each accepted segment, and
        # asked about segments an earlier learner life accepted (a re-send after a crash cut the ack)
        self._on_accept, self._seen_before = on_accept, seen_before
        self._on_queued = on_queued  # flow control: each accepted segment, once (rlfleet.learner.pacing)

    def seen(self, client_id: str, segment_id: int) -> bool:
        with self._lock:
            return (client_id, segment_id) in self._seen

    def put(self, item: IngestedSegment, timeout: float) -> bool:
        """Enqueue unless already seen; False if the queue stayed full for `timeout` seconds.

        A retried push of a segment whose first push is still waiting for room waits for that
        first push's outcome instead of racing it into the queue a second time.
        """
        key = (item.client_id, item.segment_id)
        while True:
            with self._lock:
                if key in self._seen or (self._seen_before is not None and self._seen_before(*key)):
                    self.duplicates += 1
                    return True
                other = self._inflight.get(key)
                if other is None:
                    mine = self._inflight[key] = threading.Event()
                    break
            if not other.wait(timeout):
                return False
        try:
            self._q.put((_oldest_version(item), next(self._arrivals), item), timeout=timeout)
            ok = True
        except queue.Full:
            ok = False
        with self._lock:
            del self._inflight[key]
            if ok:
                self._seen[key] = None
                while len(self._seen) > self._remember:
                    self._seen.popitem(last=False)
                self.accepted += 1
                self.accepted_env_steps += _env_steps(item)
                self.by_client[item.client_id] = self.by_client.get(item.client_id, 0) + 1
                if self._on_accept is not None:
                    self._on_accept(item.client_id, item.segment_id, _env_steps(item))
                if self._on_queued is not None:
                    self._on_queued(item)
        mine.set()
        return ok

    def get(self, timeout: float) -> IngestedSegment | None:
        try:
            _, _, item = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        with self._lock:
            self.consumed += 1
            self.consumed_env_steps += _env_steps(item)
        return item

    def count_duplicate(self) -> None:
        with self._lock:
            self.duplicates += 1

    def count_rejected(self, reason: str = "malformed") -> None:
        with self._lock:
            self.rejected += 1
            self._rejected_by[reason] += 1

    def rejected_by_reason(self) -> dict[str, int]:
        with self._lock:
            return dict(self._rejected_by)

    def accounting(self) -> dict[str, int]:
        """Segment and env-step totals, to check that nothing was counted twice or lost in between:
        accepted == consumed + still queued, and duplicates were acknowledged but not queued."""
        with self._lock:
            return {
                "accepted": self.accepted,
                "accepted_env_steps": self.accepted_env_steps,
                "consumed": self.consumed,
                "consumed_env_steps": self.consumed_env_steps,
                "queued": self._q.qsize(),
                "duplicates": self.duplicates,
                "rejected": self.rejected,
            }

    def qsize(self) -> int:
        return self._q.qsize()
