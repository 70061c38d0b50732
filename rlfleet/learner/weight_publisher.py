"""Versioned weights held by the learner and streamed to whoever watches them."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from rlfleet.policies.checkpoint_io import checksum


@dataclass(frozen=True)
class WeightVersion:
    version: int
    data: bytes
    checksum: str


class WeightPublisher:
    """Keeps the newest weights; watchers block on a condition until a newer version exists."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._current: WeightVersion | None = None
        self._final = False

    def publish(self, version: int, data: bytes) -> WeightVersion:
        with self._cond:
            if self._current is not None and version <= self._current.version:
                raise ValueError(f"version must grow: {version} after {self._current.version}")
            self._current = WeightVersion(version, data, checksum(data))
            self._cond.notify_all()
            return self._current

    def finish(self) -> None:
        """Training is over: wake watchers so their streams can end."""
        with self._cond:
            self._final = True
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        return self._final

    def current(self) -> WeightVersion | None:
        with self._cond:
            return self._current

    def wait_newer(self, known_version: int, timeout: float) -> WeightVersion | None:
        """The current weights once their version exceeds known_version, else None on timeout/finish."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._final or (self._current is not None and self._current.version > known_version),
                timeout=timeout,
            )
            if self._current is not None and self._current.version > known_version:
                return self._current
            return None
