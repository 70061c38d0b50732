import numpy as np
import pytest

from rlfleet.wire import codec
from rlfleet.wire.gen import tensor_pb2


@pytest.mark.parametrize("dtype", sorted(codec.ALLOWED_DTYPES))
def test_round_trip_every_dtype(dtype):
    arr = (np.arange(24).reshape(2, 3, 4) % 2).astype(dtype)
    back = codec.decode_tensor(codec.encode_tensor("x", arr))
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)


def test_map_round_trip_keeps_strings_and_non_contiguous_arrays():
    states = np.random.default_rng(0).normal(size=(4, 39)).astype(np.float32)
    msg = codec.encode_map({"states": states[:, ::2], "task_descriptions": ["reach", "push"]})
    wire = tensor_pb2.TensorMap.FromString(msg.SerializeToString())
    out = codec.decode_map(wire)
    np.testing.assert_array_equal(out["states"], states[:, ::2])
    assert out["task_descriptions"] == ["reach", "push"]


def test_scalar_keeps_its_zero_dimensions():
    out = codec.decode_map(codec.encode_map({"n": np.array(5, np.int64)}))
    assert out["n"].shape == () and int(out["n"]) == 5


def test_frames_round_trip_and_zero_size():
    arrays = {"a": np.ones((3, 2), np.float32), "empty": np.zeros((0, 5), np.int64)}
    out = codec.decode_frames([bytes(f) for f in codec.encode_frames(arrays)])
    np.testing.assert_array_equal(out["a"], arrays["a"])
    assert out["empty"].shape == (0, 5)


def test_wrong_size_for_shape_is_a_clear_error():
    bad = tensor_pb2.Tensor(name="states", dtype="float32", shape=[2, 3], data=b"\0" * 20)
    with pytest.raises(codec.WireFormatError, match=r"20 bytes .*float32.*\[2, 3\].*expected 24"):
        codec.decode_tensor(bad)


def test_unknown_dtype_is_a_clear_error():
    bad = tensor_pb2.Tensor(name="x", dtype="object", shape=[1], data=b"\0" * 8)
    with pytest.raises(codec.WireFormatError, match="unknown dtype 'object'"):
        codec.decode_tensor(bad)


def test_negative_shape_size_limit_and_schema_version():
    with pytest.raises(codec.WireFormatError, match="negative"):
        codec.decode_tensor(tensor_pb2.Tensor(name="x", dtype="uint8", shape=[-1], data=b""))
    with pytest.raises(codec.WireFormatError, match="exceeds the limit"):
        codec.decode_tensor(tensor_pb2.Tensor(name="x", dtype="uint8", shape=[10**6], data=b""), max_bytes=1000)
    with pytest.raises(codec.WireFormatError, match="schema version 99"):
        codec.decode_map(tensor_pb2.TensorMap(schema_version=99))


def test_frames_count_mismatch_and_garbage_header():
    frames = codec.encode_frames({"a": np.ones(3, np.float32)})
    with pytest.raises(codec.WireFormatError, match="1 tensors but 0 data frames"):
        codec.decode_frames(frames[:1])
    with pytest.raises(codec.WireFormatError, match="unreadable tensor header"):
        codec.decode_frames([b"\xff\xff\xff\xff"])


def test_require_checks_dtype_shape_and_nan():
    t = {"s": np.array([[1.0, np.nan]], np.float32)}
    assert codec.require(t, "s", "float32", (None, 2)).shape == (1, 2)
    with pytest.raises(codec.WireFormatError, match="missing tensor 'x'"):
        codec.require(t, "x")
    with pytest.raises(codec.WireFormatError, match=r"shape \[1, 2\], expected \['\*', 3\]"):
        codec.require(t, "s", shape=(None, 3))
    with pytest.raises(codec.WireFormatError, match="NaN"):
        codec.require(t, "s", finite=True)


def test_split_chunks_reassembles():
    payload = bytes(range(256)) * 40
    chunks = codec.split_chunks(payload, 1000)
    assert len(chunks) == 11 and all(len(c) <= 1000 for c in chunks)
    assert b"".join(bytes(c) for c in chunks) == payload
