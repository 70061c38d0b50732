"""Tensor codec: numpy arrays <-> raw dtype/shape/bytes messages, validated, never pickle.

Every decoder checks what it is given (known dtype, non-negative shape, byte count equal to
shape x itemsize, size limit) and raises WireFormatError with a message that says what was
wrong, so a server can answer with that error and keep serving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from rlfleet.wire.gen import tensor_pb2

SCHEMA_VERSION = 1
ALLOWED_DTYPES = frozenset(["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"])
DEFAULT_MAX_TENSOR_BYTES = 256 * 1024 * 1024

Tensors = dict[str, "np.ndarray | list[str]"]


class WireFormatError(ValueError):
    """A message that cannot be a valid tensor: rejected with a clear reason.

    `reason` is a short fixed label (never built from the input) so servers can count
    rejections by kind without unbounded metric labels.
    """

    def __init__(self, message: str, reason: str = "malformed"):
        super().__init__(message)
        self.reason = reason


def _check_dtype(dtype: str, name: str) -> np.dtype:
    if dtype not in ALLOWED_DTYPES:
        raise WireFormatError(
            f"tensor {name!r}: unknown dtype {dtype!r} (allowed: {', '.join(sorted(ALLOWED_DTYPES))})",
            reason="bad_dtype",
        )
    return np.dtype(dtype).newbyteorder("<")


def _check_shape(shape: Sequence[int], name: str) -> tuple[int, ...]:
    if any(d < 0 for d in shape):
        raise WireFormatError(f"tensor {name!r}: negative dimension in shape {list(shape)}", reason="bad_shape")
    return tuple(int(d) for d in shape)


def expected_nbytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """Exact (Python int) size: a huge declared shape must not wrap around in int64."""
    return math.prod(shape) * dtype.itemsize


def array_from_buffer(
    name: str,
    dtype: str,
    shape: Sequence[int],
    data: bytes | memoryview,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
) -> np.ndarray:
    """Validate (dtype, shape, bytes) and view them as a read-only array without copying."""
    dt = _check_dtype(dtype, name)
    shp = _check_shape(shape, name)
    need = expected_nbytes(dt, shp)
    if need > max_bytes:
        raise WireFormatError(f"tensor {name!r}: {need} bytes exceeds the limit of {max_bytes}", reason="too_large")
    got = memoryview(data).nbytes
    if got != need:
        raise WireFormatError(
            f"tensor {name!r}: {got} bytes of data for dtype {dtype} and shape {list(shp)} (expected {need})",
            reason="size_mismatch",
        )
    try:
        return np.frombuffer(data, dtype=dt).reshape(shp)
    except ValueError as exc:  # e.g. an empty tensor whose other dims overflow numpy's index type
        raise WireFormatError(
            f"tensor {name!r}: shape {list(shp)} is not representable: {exc}", reason="bad_shape"
        ) from exc


def _as_contiguous(arr: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype.name not in ALLOWED_DTYPES:
        raise WireFormatError(f"tensor {name!r}: dtype {arr.dtype} cannot be sent", reason="bad_dtype")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)  # keeps 0-d arrays 0-d


def encode_tensor(name: str, arr: np.ndarray) -> tensor_pb2.Tensor:
    arr = _as_contiguous(arr, name)
    return tensor_pb2.Tensor(name=name, dtype=arr.dtype.name, shape=arr.shape, data=arr.tobytes())


def decode_tensor(msg: tensor_pb2.Tensor, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> np.ndarray:
    return array_from_buffer(msg.name, msg.dtype, msg.shape, msg.data, max_bytes)


def encode_map(tensors: Mapping[str, np.ndarray | Sequence[str]]) -> tensor_pb2.TensorMap:
    """Arrays become Tensors; lists of str (task descriptions) go to `strings`."""
    out = tensor_pb2.TensorMap(schema_version=SCHEMA_VERSION)
    for name, value in tensors.items():
        if isinstance(value, (list, tuple)):
            out.strings[name].values.extend(str(v) for v in value)
        else:
            out.tensors.append(encode_tensor(name, cast(np.ndarray, value)))
    return out


def decode_map(msg: tensor_pb2.TensorMap, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> Tensors:
    if msg.schema_version != SCHEMA_VERSION:
        raise WireFormatError(
            f"unsupported tensor schema version {msg.schema_version} (this build speaks {SCHEMA_VERSION})",
            reason="schema_version",
        )
    out: Tensors = {}
    for t in msg.tensors:
        if t.name in out:
            raise WireFormatError(f"tensor {t.name!r} appears twice", reason="duplicate_tensor")
        out[t.name] = decode_tensor(t, max_bytes)
    for name, lst in msg.strings.items():
        out[name] = list(lst.values)
    return out


def encode_frames(tensors: Mapping[str, np.ndarray | Sequence[str]]) -> list[bytes | memoryview]:
    """Multipart form for ZeroMQ: a header (TensorMap without data) then one raw frame per tensor.

    The raw frames are memoryviews of the arrays, so zmq can send them with copy=False.
    """
    header = tensor_pb2.TensorMap(schema_version=SCHEMA_VERSION)
    frames: list[bytes | memoryview] = []
    for name, value in tensors.items():
        if isinstance(value, (list, tuple)):
            header.strings[name].values.extend(str(v) for v in value)
            continue
        arr = _as_contiguous(cast(np.ndarray, value), name)
        header.tensors.append(tensor_pb2.Tensor(name=name, dtype=arr.dtype.name, shape=arr.shape))
        # ndarray is a buffer; typeshed's Buffer protocol only covers it from Python 3.12
        frames.append(memoryview(arr).cast("B") if arr.size else b"")  # type: ignore[arg-type]
    return [header.SerializeToString(), *frames]


def decode_frames(frames: Sequence[bytes | memoryview], max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> Tensors:
    if not frames:
        raise WireFormatError("empty message: expected a header frame", reason="protocol")
    header = tensor_pb2.TensorMap()
    try:
        header.ParseFromString(bytes(frames[0]))
    except Exception as exc:  # protobuf raises DecodeError; report it as a wire error
        raise WireFormatError(f"unreadable tensor header: {exc}", reason="undecodable") from exc
    if header.schema_version != SCHEMA_VERSION:
        raise WireFormatError(
            f"unsupported tensor schema version {header.schema_version} (this build speaks {SCHEMA_VERSION})",
            reason="schema_version",
        )
    if len(frames) - 1 != len(header.tensors):
        raise WireFormatError(
            f"header names {len(header.tensors)} tensors but {len(frames) - 1} data frames came",
            reason="protocol",
        )
    out: Tensors = {}
    for t, data in zip(header.tensors, frames[1:]):
        if t.name in out:
            raise WireFormatError(f"tensor {t.name!r} appears twice", reason="duplicate_tensor")
        out[t.name] = array_from_buffer(t.name, t.dtype, t.shape, data, max_bytes)
    for name, lst in header.strings.items():
        out[name] = list(lst.values)
    return out


def require(
    tensors: Mapping[str, object],
    name: str,
    dtype: str | None = None,
    shape: Sequence[int | None] | None = None,
    finite: bool = False,
) -> np.ndarray:
    """Fetch a tensor a message must carry, checking dtype, shape (None = any) and NaN/inf."""
    if name not in tensors:
        raise WireFormatError(
            f"missing tensor {name!r} (got: {', '.join(sorted(tensors)) or 'none'})", reason="missing_tensor"
        )
    arr = tensors[name]
    if not isinstance(arr, np.ndarray):
        raise WireFormatError(f"{name!r} must be a tensor, not a list of strings", reason="bad_dtype")
    if dtype is not None and arr.dtype.name != dtype:
        raise WireFormatError(f"tensor {name!r}: dtype {arr.dtype.name}, expected {dtype}", reason="bad_dtype")
    if shape is not None:
        if len(shape) != arr.ndim or any(s is not None and s != d for s, d in zip(shape, arr.shape)):
            want = ["*" if s is None else s for s in shape]
            raise WireFormatError(f"tensor {name!r}: shape {list(arr.shape)}, expected {want}", reason="bad_shape")
    if finite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise WireFormatError(f"tensor {name!r} contains NaN or inf", reason="non_finite")
    return arr


def split_chunks(payload: bytes, max_chunk_bytes: int) -> list[memoryview]:
    """Cut a payload into pieces under the gRPC message limit (chunked streaming)."""
    if max_chunk_bytes <= 0:
        raise ValueError("max_chunk_bytes must be positive")
    view = memoryview(payload)
    return [view[i : i + max_chunk_bytes] for i in range(0, max(len(view), 1), max_chunk_bytes)]
