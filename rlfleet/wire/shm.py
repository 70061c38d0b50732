"""Named shared-memory blocks holding several numpy arrays (Sample-Factory-style slots).

A layout (name -> shape, dtype) is plain JSON so another process (an env worker, or the
inference server on the same host) can attach to the same block by name and get views.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

_ALIGN = 64


@dataclass(frozen=True)
class ArraySpec:
    shape: tuple[int, ...]
    dtype: str


Layout = dict[str, ArraySpec]


def layout_to_json(layout: Layout) -> str:
    return json.dumps({k: [list(v.shape), v.dtype] for k, v in layout.items()})


def layout_from_json(text: str) -> Layout:
    return {k: ArraySpec(tuple(int(d) for d in shape), str(dtype)) for k, (shape, dtype) in json.loads(text).items()}


def _offsets(layout: Layout) -> tuple[dict[str, int], int]:
    offsets, pos = {}, 0
    for name, spec in layout.items():
        offsets[name] = pos
        nbytes = int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
        pos += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return offsets, max(pos, _ALIGN)


class SharedArrays:
    """Arrays living in one shared-memory block; `arrays[name]` are numpy views into it."""

    def __init__(self, shm: shared_memory.SharedMemory, layout: Layout, owner: bool):
        self.shm = shm
        self.layout = layout
        self.owner = owner
        offsets, _ = _offsets(layout)
        self.arrays: dict[str, np.ndarray] = {
            name: np.ndarray(spec.shape, dtype=spec.dtype, buffer=shm.buf, offset=offsets[name])
            for name, spec in layout.items()
        }

    @property
    def name(self) -> str:
        return self.shm.name

    @classmethod
    def create(cls, layout: Layout, prefix: str = "rlfleet") -> "SharedArrays":
        _, size = _offsets(layout)
        shm = shared_memory.SharedMemory(
            name=f"{prefix}_{secrets.token_hex(6)}", create=True, size=size
        )
        out = cls(shm, layout, owner=True)
        for arr in out.arrays.values():
            arr.fill(0)
        return out

    @classmethod
    def attach(cls, name: str, layout: Layout, untrack: bool = True) -> "SharedArrays":
        """Map an existing block. `untrack=False` only for the owner's own child processes.

        Python < 3.13 registers attached blocks with the process's resource tracker, which would
        unlink the owner's block when an unrelated process (an inference server) exits; children
        share the owner's tracker, where unregistering would instead drop the owner's entry.
        """
        shm = shared_memory.SharedMemory(name=name, create=False)
        if untrack:
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        _, size = _offsets(layout)
        if shm.size < size:
            shm.close()
            raise ValueError(f"shared block {name} holds {shm.size} bytes, layout needs {size}")
        return cls(shm, layout, owner=False)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def close(self) -> None:
        self.arrays = {}
        try:
            self.shm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the OS frees the mapping at exit
        if self.owner:
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass
