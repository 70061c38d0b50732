"""Versioned weights held by the learner and streamed to whoever watches them.

Besides the full safetensors bytes of the newest version, the publisher remembers the version
at which each tensor last changed (by content digest), so a puller that holds version b can be
sent only the tensors changed since b: frozen backbones and untouched buffers never travel
again. Deltas are built on demand from the current full bytes and cached per base version.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rlfleet.policies.checkpoint_io import checksum


@dataclass(frozen=True)
class WeightVersion:
    version: int
    data: bytes
    checksum: str
    base_version: int = -1  # -1: all tensors; else only those changed since base_version
    tensor_names: tuple[str, ...] = field(default=())


def tensor_digest(t: torch.Tensor) -> str:
    """Content digest of one tensor (dtype, shape and bytes): equal digests, equal tensors."""
    t = t.detach().cpu().contiguous()
    h = hashlib.blake2b(f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=16)
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def tensor_digests(
    tensors: Mapping[str, torch.Tensor], previous: Mapping[str, str] | None = None, frozen: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Digests of every tensor; frozen ones keep their previous digest without being hashed again."""
    previous = previous or {}
    return {
        name: previous[name] if name in frozen and name in previous else tensor_digest(t) for name, t in tensors.items()
    }


class WeightPublisher:
    """Keeps the newest weights; watchers block on a condition until a newer version exists."""

    DELTA_CACHE = 4  # deltas kept for the current version (pullers usually share one base)

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._current: WeightVersion | None = None
        self._final = False
        self._digests: dict[str, str] = {}
        self._changed_at: dict[str, int] = {}
        self._tracked_since: int | None = None  # first version whose tensors we know
        self._deltas: OrderedDict[int, WeightVersion] = OrderedDict()

    def publish(self, version: int, data: bytes, digests: Mapping[str, str] | None = None) -> WeightVersion:
        """Make `version` current. With per-tensor `digests`, later pullers can ask for deltas."""
        with self._cond:
            if self._current is not None and version <= self._current.version:
                raise ValueError(f"version must grow: {version} after {self._current.version}")
            self._current = WeightVersion(version, data, checksum(data))
            self._track(version, digests)
            self._deltas.clear()
            self._cond.notify_all()
            return self._current

    def _track(self, version: int, digests: Mapping[str, str] | None) -> None:
        if digests is None or (self._digests and set(digests) != set(self._digests)):
            self._tracked_since = None if digests is None else version  # names changed: start over
            self._changed_at = {name: version for name in digests or {}}
        elif self._tracked_since is None:
            self._tracked_since = version
            self._changed_at = {name: version for name in digests}
        else:
            for name, digest in digests.items():
                if self._digests.get(name) != digest:
                    self._changed_at[name] = version
        self._digests = dict(digests or {})

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

    def delta_since(self, base_version: int) -> WeightVersion | None:
        """The current version as a delta on `base_version`, or the full weights when the base is
        unknown (older than this process's first publish, newer than current, or untracked)."""
        with self._cond:
            cur = self._current
            if cur is None:
                return None
            known = self._tracked_since is not None and self._tracked_since <= base_version <= cur.version
            if not known:
                return cur
            if base_version in self._deltas:
                return self._deltas[base_version]
            changed = [n for n, v in self._changed_at.items() if v > base_version]
        # Building the bytes takes a while for a big model: not under the lock the trainer publishes with.
        full = st_load(cur.data)
        data = st_save({n: full[n] for n in changed})
        delta = WeightVersion(cur.version, data, checksum(data), base_version, tuple(changed))
        with self._cond:
            if self._current is cur:  # still the current version: share it with the next pullers
                self._deltas[base_version] = delta
                while len(self._deltas) > self.DELTA_CACHE:
                    self._deltas.popitem(last=False)
        return delta

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
