"""Named shared-memory blocks holding several numpy arrays (Sample-Factory-style slots).

A layout (name -> shape, dtype) is plain JSON so another process (an env worker, or the
inference server on the same host) can attach to the same block by name and get views.

Every block starts with a 64-byte header: a magic and a random per-block secret. A process
that attaches on a peer's word (the inference server) must be given that secret, which only
a process that can already read the block knows, and the name must carry this project's
prefix: a client cannot make the server map a block some other process created. Layout
dtypes are limited to plain numeric ones (no object pointers in shared memory).
"""

from __future__ import annotations

import _posixshmem  # the module multiprocessing.shared_memory itself uses for shm_open
import ctypes
import hmac
import json
import mmap
import os
import re
import secrets
import threading
import weakref
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from rlfleet.wire.codec import WireFormatError

_ALIGN = 64
_HEADER = 64  # magic (8) + secret (16), padded to one alignment unit
_MAGIC = b"RLFLSHM1"
_SECRET_BYTES = 16
PREFIX = "rlfleet"
# Plain numeric dtypes only: an object dtype would put heap pointers into shared memory.
PLAIN_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"}
)
MAX_ARRAYS = 256  # per layout
MAX_NDIM = 8
MAX_BLOCK_BYTES = 1 << 40
_NAME = re.compile(rf"{PREFIX}_[A-Za-z0-9_]{{1,64}}\Z")


def _check_header(header: bytes, secret: object) -> None:
    """A block's magic and secret (hex) match, compared in constant time; WireFormatError otherwise."""
    try:
        given = bytes.fromhex(secret) if isinstance(secret, str) else b""
    except ValueError:
        given = b""
    if header[: len(_MAGIC)] != _MAGIC or not hmac.compare_digest(header[len(_MAGIC) :], given):
        raise WireFormatError("shared block secret does not match", reason="attach_denied")


@dataclass(frozen=True)
class ArraySpec:
    shape: tuple[int, ...]
    dtype: str


Layout = dict[str, ArraySpec]


def layout_to_json(layout: Layout) -> str:
    return json.dumps({k: [list(v.shape), v.dtype] for k, v in layout.items()})


def layout_from_json(text: str | bytes) -> Layout:
    """Parse and check a layout: plain dtypes, non-negative dims, a bounded size (WireFormatError)."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WireFormatError(f"layout is not JSON: {exc}", reason="bad_layout") from exc
    return check_layout(raw)


def check_layout(raw: object) -> Layout:
    """A layout from its JSON form {name: [shape, dtype]}, refused unless every entry is plain."""
    if not isinstance(raw, dict) or not raw or len(raw) > MAX_ARRAYS:
        raise WireFormatError(f"layout must map 1..{MAX_ARRAYS} names to [shape, dtype]", reason="bad_layout")
    out: Layout = {}
    for name, entry in raw.items():
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise WireFormatError(f"layout entry {str(name)[:64]!r} must be [shape, dtype]", reason="bad_layout")
        shape, dtype = entry
        if not isinstance(dtype, str) or dtype not in PLAIN_DTYPES:
            raise WireFormatError(
                f"layout dtype {str(dtype)[:32]!r} is not one of {sorted(PLAIN_DTYPES)}", reason="bad_dtype"
            )
        if (
            not isinstance(shape, (list, tuple))
            or len(shape) > MAX_NDIM
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_BLOCK_BYTES for d in shape)
        ):
            raise WireFormatError(
                f"layout shape of {str(name)[:64]!r} must be at most {MAX_NDIM} non-negative integers",
                reason="bad_shape",
            )
        out[str(name)] = ArraySpec(tuple(shape), dtype)
    if _offsets(out)[1] > MAX_BLOCK_BYTES:
        raise WireFormatError("layout is larger than any block could be", reason="bad_shape")
    return out


def _offsets(layout: Layout) -> tuple[dict[str, int], int]:
    offsets, pos = {}, _HEADER
    for name, spec in layout.items():
        offsets[name] = pos
        nbytes = int(np.prod(spec.shape, dtype=object)) * np.dtype(spec.dtype).itemsize
        pos += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return offsets, max(pos, _ALIGN)


def _libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """An existing block mapped read-write, holding no fd and never unlinking it.

    multiprocessing's SharedMemory unlinks a block it fails to map (deleting another process's
    block, e.g. at the fd limit), and Python's mmap keeps a duplicate fd per mapping; this
    maps with mmap(2) directly and unmaps only once no numpy view of the block is left.
    """

    _lib = None

    def __init__(self, name: str):
        if _Mapping._lib is None:
            _Mapping._lib = _libc()
        lib = _Mapping._lib
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER:
                raise WireFormatError(
                    f"shared block {name} is too small to be an rlfleet block", reason="attach_denied"
                )
            addr = lib.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
            if addr in (None, _MAP_FAILED):
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            os.close(fd)  # the mapping keeps the memory: an attach costs no fd
        memory = (ctypes.c_char * size).from_address(addr)
        # munmap when the last reference goes (ours and every numpy view's): never under a live view
        weakref.finalize(memory, lib.munmap, addr, size).atexit = False  # at exit the OS unmaps (a daemon
        # thread may still hold a view then)
        self.name, self.size = name, size
        self.buf: memoryview | None = memoryview(memory).cast("B")

    def close(self) -> None:
        self.buf = None


class SharedArrays:
    """Arrays living in one shared-memory block; `arrays[name]` are numpy views into it."""

    def __init__(self, shm, layout: Layout, owner: bool):
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

    @property
    def secret(self) -> str:
        """The block's secret (hex): what a peer must present to have the inference server attach it."""
        return bytes(self.shm.buf[len(_MAGIC) : len(_MAGIC) + _SECRET_BYTES]).hex()

    @classmethod
    def create(cls, layout: Layout, prefix: str = PREFIX) -> SharedArrays:
        _, size = _offsets(layout)
        shm = shared_memory.SharedMemory(name=f"{prefix}_{secrets.token_hex(6)}", create=True, size=size)
        buf = shm.buf
        assert buf is not None  # a block just created is mapped
        buf[: len(_MAGIC)] = _MAGIC
        buf[len(_MAGIC) : len(_MAGIC) + _SECRET_BYTES] = secrets.token_bytes(_SECRET_BYTES)
        out = cls(shm, layout, owner=True)
        for arr in out.arrays.values():
            arr.fill(0)
        return out

    @classmethod
    def attach(cls, name: str, layout: Layout, untrack: bool = True, secret: str | None = None) -> SharedArrays:
        """Map an existing block; with `secret`, only an rlfleet block holding that secret.

        The mapping is never registered with a resource tracker (so no process but the owner
        ever unlinks the block); `untrack` is kept for callers of the older signature.
        """
        if secret is not None and (not isinstance(name, str) or not _NAME.match(name)):
            raise WireFormatError(f"shared block name must look like {PREFIX}_<hex>", reason="attach_denied")
        try:
            shm = _Mapping(name)
        except FileNotFoundError as exc:
            raise WireFormatError(f"no shared block named {name[:80]!r}", reason="attach_failed") from exc
        except PermissionError as exc:
            raise WireFormatError(f"shared block {name[:80]!r} is not accessible", reason="attach_denied") from exc
        except OSError as exc:  # e.g. out of fds or address space: refused, never unlinked
            raise WireFormatError(
                f"could not map shared block {name[:80]!r}: {exc.strerror}", reason="attach_failed"
            ) from exc
        try:
            assert shm.buf is not None
            if secret is not None:
                _check_header(bytes(shm.buf[: len(_MAGIC) + _SECRET_BYTES]), secret)
            _, size = _offsets(layout)
            if shm.size < size:
                raise WireFormatError(
                    f"shared block {name} holds {shm.size} bytes, layout needs {size}", reason="bad_shape"
                )
            return cls(shm, layout, owner=False)
        except BaseException:
            shm.close()
            raise

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


def _pread_all(fd: int, view: memoryview, pos: int) -> bool:
    """Fill `view` from `pos`; False when the file ends first."""
    while view:
        got = os.preadv(fd, [view], pos)
        if got <= 0:
            return False
        view, pos = view[got:], pos + got
    return True


class PeerBlock:
    """A peer's block, read and written with pread/pwrite on its name and never mapped.

    The inference server serves blocks that other processes own. A mapped block that its
    owner truncates (ftruncate to 0, or below the rows read) turns the next access into SIGBUS,
    which no Python code can catch; a system call on a shorter file returns a short count
    instead, so here a truncated or removed block is a clean error. One fd is held per block
    name, shared by every attach of it (no address space): every access checks it with fstat, so a
    block its owner removed (no links left) or truncated is refused, as a fresh open by name
    would, without paying for the open and close on every request.
    """

    _by_name: dict[str, int] = {}  # block name -> the fd its attaches share
    _holders: dict[int, int] = {}  # fd -> attaches holding it
    _shared_lock = threading.Lock()

    def __init__(self, name: str, layout: Layout, size: int):
        self.name, self.layout, self.size = name, layout, size
        self._fd: int | None = None
        self.offsets, _ = _offsets(layout)
        self._row_bytes = {
            key: int(np.prod(spec.shape[1:], dtype=np.int64)) * np.dtype(spec.dtype).itemsize
            for key, spec in layout.items()
        }

    @classmethod
    def attach(cls, name: str, layout: Layout, secret: str) -> PeerBlock:
        """An rlfleet block holding `secret` and at least the layout's size (WireFormatError otherwise)."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise WireFormatError(f"shared block name must look like {PREFIX}_<hex>", reason="attach_denied")
        _, size = _offsets(layout)
        out = cls(name, layout, size)
        fd = out._open()
        try:
            _check_header(os.pread(fd, len(_MAGIC) + _SECRET_BYTES, 0), secret)
            have = os.fstat(fd).st_size
            if have < size:
                raise WireFormatError(
                    f"shared block {name} holds {have} bytes, layout needs {size}", reason="bad_shape"
                )
        except BaseException:
            os.close(fd)
            raise
        with cls._shared_lock:
            held = cls._by_name.get(name)
            if held is not None and os.fstat(held).st_nlink > 0:
                os.close(fd)  # the block this name already holds, still linked: share its fd
                fd = held
            else:  # first attach, or the name was removed and made anew: the old fd stays with its holders
                cls._by_name[name] = fd
            cls._holders[fd] = cls._holders.get(fd, 0) + 1
        out._fd = fd
        return out

    def _open(self) -> int:
        """Open the block by name (at attach only: later accesses use the held fd)."""
        reason = "attach_failed"
        try:
            return _posixshmem.shm_open("/" + self.name, os.O_RDWR, mode=0o600)
        except FileNotFoundError as exc:
            raise WireFormatError(f"no shared block named {self.name[:80]!r}", reason=reason) from exc
        except PermissionError as exc:
            raise WireFormatError(f"shared block {self.name[:80]!r} is not accessible", reason="attach_denied") from exc
        except OSError as exc:  # e.g. out of fds: this attach is refused, the block is left alone
            raise WireFormatError(
                f"could not open shared block {self.name[:80]!r}: {exc.strerror}", reason=reason
            ) from exc

    def _checked_fd(self) -> int:
        """The held fd, once fstat says the block still has a name and its layout's size."""
        if self._fd is None:
            raise WireFormatError(f"shared block {self.name[:80]!r} was released", reason="block_gone")
        st = os.fstat(self._fd)
        if st.st_nlink == 0:  # its owner unlinked it: what we would read or write no one will see
            raise WireFormatError(f"no shared block named {self.name[:80]!r}", reason="block_gone")
        if st.st_size < self.size:
            raise WireFormatError(
                f"shared block {self.name} was truncated to {st.st_size} bytes (its layout needs {self.size})",
                reason="block_truncated",
            )
        return self._fd

    def read_rows(self, keys: list[str], lo: int, hi: int) -> dict[str, np.ndarray]:
        """Private copies of rows lo:hi of each named array."""
        fd = self._checked_fd()
        out = {}
        for key in keys:
            spec = self.layout[key]
            arr = np.empty((hi - lo, *spec.shape[1:]), dtype=spec.dtype)
            if not _pread_all(fd, arr.data.cast("B"), self.offsets[key] + lo * self._row_bytes[key]):
                # truncated after the size check: the rows are not all there
                raise WireFormatError(
                    f"shared block {self.name} was truncated while its rows were read", reason="block_truncated"
                )
            out[key] = arr
        return out

    def write_rows(self, values: dict[str, np.ndarray], lo: int, hi: int) -> None:
        """Write rows lo:hi of each named array (cast to the slot's dtype, shape checked)."""
        fd = self._checked_fd()
        for key, value in values.items():
            spec = self.layout[key]
            want = (hi - lo, *spec.shape[1:])
            if tuple(np.shape(value)) != want:
                raise ValueError(f"slot {key!r} takes {list(want)} for these rows, got {list(np.shape(value))}")
            data = np.ascontiguousarray(np.asarray(value).astype(spec.dtype, casting="same_kind", copy=False))
            # a truncation racing this write makes pwrite extend the file back (up to the layout's
            # size, which was checked at attach), never fault
            view, pos = data.data.cast("B"), self.offsets[key] + lo * self._row_bytes[key]
            while view:
                done = os.pwrite(fd, view, pos)
                view, pos = view[done:], pos + done

    def close(self) -> None:
        """Release the held fd (the block itself is its owner's)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with self._shared_lock:
            left = self._holders.pop(fd) - 1
            if left:
                self._holders[fd] = left
                return
            if self._by_name.get(self.name) == fd:
                del self._by_name[self.name]
            os.close(fd)  # under the lock: an attach must not be handed this number while it closes
