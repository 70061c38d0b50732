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
        """Enqueue unless already seen; False if the queue stayed full for `timeout` seconds."""
        key = (item.client_id, item.segment_id)
        with self._lock:
            if key in self._seen:
                self.duplicates += 1
                return True
        try:
            self._q.put(item, timeout=timeout)
        except queue.Full:
            return False
        with self._lock:
            self._seen[key] = None
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)
            self.accepted += 1
            self.by_client[item.client_id] = self.by_client.get(item.client_id, 0) + 1
        return True

    def get(self, timeout: float) -> IngestedSegment | None:
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def count_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def qsize(self) -> int:
        return self._q.qsize()
