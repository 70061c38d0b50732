"""The learner's bounded ingest queue: back-pressure, de-duplication and rejection counts."""
from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass

from rlfleet.wire.segment import Segment


@dataclass
class IngestedSegment:
    client_id: str
    segment_id: int
    segment: Segment


class IngestQueue:
    """A full queue blocks the pushing RPC, which blocks the actor: a slow learner slows actors."""

    def __init__(self, maxsize: int, remember: int = 4096):
        self._q: queue.Queue[IngestedSegment] = queue.Queue(maxsize=maxsize)
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._inflight: dict[tuple[str, int], threading.Event] = {}
        self._remember = remember
        self._lock = threading.Lock()
        self.accepted = 0
        self.duplicates = 0
        self.rejected = 0
        self.by_client: dict[str, int] = {}

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
                if key in self._seen:
                    self.duplicates += 1
                    return True
                other = self._inflight.get(key)
                if other is None:
                    mine = self._inflight[key] = threading.Event()
                    break
            if not other.wait(timeout):
                return False
        try:
            self._q.put(item, timeout=timeout)
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
                self.by_client[item.client_id] = self.by_client.get(item.client_id, 0) + 1
        mine.set()
        return ok

    def get(self, timeout: float) -> IngestedSegment | None:
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def count_duplicate(self) -> None:
        with self._lock:
            self.duplicates += 1

    def count_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def qsize(self) -> int:
        return self._q.qsize()
