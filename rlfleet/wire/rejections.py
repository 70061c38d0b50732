"""Bad input counted by reason, so every role can show what it refused and why.

Reasons are short fixed labels (`WireFormatError.reason`, or a front end's own such as
"protocol", "undecodable", "overloaded"), never text taken from the request, so they stay a
small set that a metrics exporter can use as a label.
"""

from __future__ import annotations

import threading
from collections import Counter


class RejectionCounter:
    """Thread-safe counts of rejected requests keyed by reason."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


def merge_counts(*parts: dict[str, int]) -> dict[str, int]:
    """Sum several reason -> count maps (e.g. a server's front ends) into one."""
    out: Counter[str] = Counter()
    for part in parts:
        out.update(part)
    return {k: v for k, v in out.items() if v}
