"""Seeded fuzzing of every front end that takes bytes from the network.

A real inference server (gRPC Act stream and ZeroMQ) and a real learner (PushTrajectory) on
loopback get a few hundred randomly malformed messages: random bytes, truncated protobufs,
wrong dtypes and shapes, NaN/inf, oversized and negative dims, byte counts that do not match,
unknown policy versions, broken chunking. Every one must get a clear error (an error reply, a
rejected ack, or INVALID_ARGUMENT / RESOURCE_EXHAUSTED), be counted by reason, and leave the
server serving valid requests afterwards. RLFLEET_FUZZ_SEED=N explores other seeds (default 0).
"""

from __future__ import annotations

import os
import struct
import threading
import time

import grpc
import numpy as np
import pytest
import torch
import zmq
from role_processes import TINY

from rlfleet.envs.run_shapes import run_observation_spec
from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.inference_server.server import InferenceServer
from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire import codec
from rlfleet.wire.gen import inference_pb2, inference_pb2_grpc, learner_pb2, learner_pb2_grpc, tensor_pb2
from rlfleet.wire.segment import Segment

S, D, K = 7, 3, 2
SEED = int(os.environ.get("RLFLEET_FUZZ_SEED", "0"))
CASES = 120  # per front end; the generators cycle through every kind of damage
BIG = 65 * 1024 * 1024  # over the 64 MB gRPC message limit
REASONS = {
    "undecodable",
    "bad_dtype",
    "bad_shape",
    "non_finite",
    "too_large",
    "size_mismatch",
    "missing_tensor",
    "schema_version",
    "duplicate_tensor",
    "protocol",
    "bad_attach",
    "bad_layout",
    "attach_denied",
    "attach_failed",
}


# ---- malformed observation maps (shared by gRPC and ZeroMQ) ------------------------------------


def _tensor(name: str, dtype: str, shape: list[int], data: bytes) -> tensor_pb2.Tensor:
    return tensor_pb2.Tensor(name=name, dtype=dtype, shape=shape, data=data)


def bad_obs(rng: np.random.Generator, i: int) -> tensor_pb2.TensorMap:
    """The i-th damaged observation (TensorMap with data inline); kinds cycle, details are random."""
    b = int(rng.integers(1, 9))
    good = rng.normal(size=(b, S)).astype(np.float32)
    m = tensor_pb2.TensorMap(schema_version=codec.SCHEMA_VERSION)
    kind = i % 12
    if kind == 0:  # a dtype the policy does not take
        dt = str(rng.choice(["float64", "int32", "uint8", "bool", "float16", "int64"]))
        arr = good.astype(dt)
        m.tensors.append(_tensor("states", dt, list(arr.shape), arr.tobytes()))
    elif kind == 1:  # a dtype nobody knows
        dt = str(rng.choice(["complex64", "object", "", "float33", "<f4", "U8"]))
        m.tensors.append(_tensor("states", dt, [b, S], good.tobytes()))
    elif kind == 2:  # wrong shape
        shape = [[b], [b, S + int(rng.integers(1, 4))], [b, S, 1], [0, S], []][int(rng.integers(0, 5))]
        arr = np.zeros(shape, np.float32)
        m.tensors.append(_tensor("states", "float32", shape, arr.tobytes()))
    elif kind == 3:  # NaN / inf
        good[int(rng.integers(0, b)), int(rng.integers(0, S))] = rng.choice([np.nan, np.inf, -np.inf])
        m.tensors.append(_tensor("states", "float32", [b, S], good.tobytes()))
    elif kind == 4:  # oversized dims with little data
        m.tensors.append(_tensor("states", "float32", [int(2 ** rng.integers(31, 62)), S], good.tobytes()))
    elif kind == 5:  # negative dims
        m.tensors.append(_tensor("states", "float32", [-int(rng.integers(1, 2**40)), S], good.tobytes()))
    elif kind == 6:  # a declared size the bytes do not fill (or overfill)
        m.tensors.append(_tensor("states", "float32", [b + int(rng.integers(1, 10**6)), S], good.tobytes()))
    elif kind == 7:
        m.tensors.append(_tensor("states", "float32", [b, S], good.tobytes()[: -int(rng.integers(1, 4 * S))]))
    elif kind == 8:  # the policy's key missing
        m.tensors.append(
            _tensor(str(rng.choice(["state", "obs", "main_images", "STATES"])), "float32", [b, S], good.tobytes())
        )
    elif kind == 9:  # the same tensor twice
        m.tensors.extend([_tensor("states", "float32", [b, S], good.tobytes())] * 2)
    elif kind == 10:  # a schema this build does not speak
        m.schema_version = int(rng.choice([0, 2, 99, 2**31]))
        m.tensors.append(_tensor("states", "float32", [b, S], good.tobytes()))
    else:  # text where a tensor belongs
        m.strings["states"].values.extend(["a"] * b)
    return m


def random_bytes(rng: np.random.Generator, max_len: int = 200) -> bytes:
    return rng.integers(0, 256, size=int(rng.integers(1, max_len)), dtype=np.uint8).tobytes()


def truncated(rng: np.random.Generator, payload: bytes) -> bytes:
    return payload[: int(rng.integers(1, len(payload)))]


# ---- the inference server ------------------------------------------------------------------


@pytest.fixture
def inference_server():
    torch.manual_seed(0)
    policy = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[16]))
    srv = InferenceServer(PolicyRunner(policy, version=3), "127.0.0.1", 0, 0, max_batch=64, max_wait_ms=1)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(10)


def _valid_act(stub) -> inference_pb2.ActResponse:
    obs = codec.encode_map({"states": np.zeros((2, S), np.float32)})
    (reply,) = list(stub.Act(iter([inference_pb2.ActRequest(request_id=77, obs=obs)]), timeout=30))
    return reply


def _grpc_case(rng: np.random.Generator, i: int) -> bytes:
    valid = inference_pb2.ActRequest(request_id=i + 1, obs=codec.encode_map({"states": np.zeros((3, S), np.float32)}))
    if i % 7 == 0:
        return random_bytes(rng)
    if i % 7 == 1:
        return truncated(rng, valid.SerializeToString())
    return inference_pb2.ActRequest(request_id=i + 1, obs=bad_obs(rng, i)).SerializeToString()


def test_grpc_inference_front_end_rejects_every_malformed_request(inference_server):
    rng = np.random.default_rng([SEED, 7])
    raw_act = None
    with grpc.insecure_channel(inference_server.address) as ch:
        raw_act = ch.stream_stream(
            "/rlfleet.v1.InferenceService/Act",
            request_serializer=None,
            response_deserializer=inference_pb2.ActResponse.FromString,
        )
        codes = {}
        for i in range(CASES):
            try:
                replies = list(raw_act(iter([_grpc_case(rng, i)]), timeout=30))
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (i, exc.code(), exc.details())
                assert "undecodable" in exc.details()
                codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                continue
            assert len(replies) == 1 and replies[0].error, (i, replies)  # one answer, and it is an error
            codes["error_reply"] = codes.get("error_reply", 0) + 1
        assert codes.get("INVALID_ARGUMENT", 0) > 0 and codes.get("error_reply", 0) > 0
        counted = inference_server.rejected_requests()
        assert sum(counted.values()) == CASES, counted
        assert set(counted) <= REASONS | {"internal"} and "internal" not in counted, counted

        with pytest.raises(grpc.RpcError) as big:  # over the message limit: refused by gRPC itself
            list(raw_act(iter([b"\x0a" + b"\xff" * BIG]), timeout=60))
        assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        reply = _valid_act(inference_pb2_grpc.InferenceServiceStub(ch))  # still serving
    assert reply.error == "" and reply.policy_version == 3
    assert codec.decode_map(reply.outputs)["actions"].shape == (2, K, D)


def _zmq_case(rng: np.random.Generator, i: int) -> list[bytes]:
    rid = struct.pack("<Q", i + 1)
    kind = i % 10
    if kind == 0:  # noise
        return [random_bytes(rng, 40) for _ in range(int(rng.integers(1, 5)))]
    if kind == 1:  # act with a garbage or truncated header
        header = codec.encode_frames({"states": np.zeros((2, S), np.float32)})[0]
        head = random_bytes(rng) if rng.random() < 0.5 else truncated(rng, header)
        return [b"act", rid, b"\0", head, b"\0" * (8 * S)]
    if kind == 2:  # frames that do not match the header
        frames = codec.encode_frames({"states": np.zeros((2, S), np.float32)})
        return [b"act", rid, b"\0", frames[0], *([bytes(frames[1])] * int(rng.choice([0, 2, 3])))]
    if kind == 3:  # no or a bad deterministic flag
        return [b"act", rid, *([b"\0\0"] if rng.random() < 0.5 else [])]
    if kind == 4:  # act_shm without attach, or with a bad row frame
        return [b"act_shm", rid, struct.pack("<qqq", -1, 2**40, 0)[: int(rng.choice([24, 16, 3]))]]
    if kind == 5:  # attach: bad JSON, missing keys, a block that does not exist, nonsense layout
        payload = [
            random_bytes(rng),
            b"{}",
            b'{"shm_name": "rlfleet_nope", "layout": {}}',
            b'{"shm_name": "rlfleet_nope_%d", "layout": {"actions": [[4, 2], "float32"], '
            b'"logprobs": [[4], "float32"], "values": [[4], "float32"]}}' % i,
            b'{"shm_name": 5, "layout": {"actions": [[-1], "complex"]}}',
        ][int(rng.integers(0, 5))]
        return [b"attach", rid, payload]
    if kind == 6:  # too short
        return [b"act"]
    # a well-framed act whose tensor is damaged (header + raw frames from a bad TensorMap)
    m = bad_obs(rng, i)
    header = tensor_pb2.TensorMap(schema_version=m.schema_version)
    header.strings.MergeFrom(m.strings)
    data = []
    for t in m.tensors:
        header.tensors.append(tensor_pb2.Tensor(name=t.name, dtype=t.dtype, shape=t.shape))
        data.append(t.data)
    return [b"act", rid, b"\0", header.SerializeToString(), *data]


def test_zmq_inference_front_end_rejects_every_malformed_request(inference_server):
    rng = np.random.default_rng([SEED, 11])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(inference_server.zmq.endpoint)
    try:
        for i in range(CASES):
            frames = _zmq_case(rng, i)
            sock.send_multipart(frames)
            assert sock.poll(30_000), f"case {i} got no answer: {frames[:2]}"
            reply = sock.recv_multipart()
            assert reply[0] == b"error" and reply[2], (i, frames[:2], reply)
            want = frames[1] if len(frames) >= 2 and frames[0] in (b"act", b"act_shm", b"attach") else None
            if want is not None:
                assert reply[1] == want, i  # the answer names the request it refuses
        counted = inference_server.rejected_requests()
        assert sum(counted.values()) == CASES, counted
        assert "internal" not in counted and len(set(counted) & REASONS) >= 6, counted
        frames = codec.encode_frames({"states": np.ones((2, S), np.float32)})  # still serving
        sock.send_multipart([b"act", struct.pack("<Q", 999), b"\1", *frames])
        assert sock.poll(30_000)
        reply = sock.recv_multipart()
    finally:
        sock.close()
    assert reply[0] == b"result" and struct.unpack("<q", reply[2])[0] == 3
    assert codec.decode_frames(reply[3:])["actions"].shape == (2, K, D)


# ---- the learner ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    from rlfleet.config import load_config
    from rlfleet.learner.main import Learner

    run = tmp_path_factory.mktemp("fuzz_learner")
    cfg = load_config("metaworld_reach_ppo", [*TINY, f"runner.logger.log_path={run}", "runner.total_env_steps=1000"])
    ln = Learner(cfg, run)  # a real learner: its own servicer, checks and gRPC registration, no training
    assert ln.server is None and ln.address == ""  # constructing it opens no port
    ln.start()
    yield ln
    ln.servicer.stop_event.set()
    ln.close()


def _obs(spec: dict, lead: tuple[int, ...], rng: np.random.Generator) -> dict:
    return {k: (rng.normal(size=(*lead, *shape)) * 50).astype(dtype) for k, (shape, dtype) in spec.items()}


def _segment_tensors(ln, rng: np.random.Generator) -> dict:
    """A valid segment for the learner's run (its env's observation keys, its policy's shapes)."""
    d, T, B = ln.spec, 4, 2
    spec = run_observation_spec(ln.env_cfg, d)
    n = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    seg = Segment(
        obs=_obs(spec, (T, B), rng),
        actions=n(T, B, ln.cfg.env.chunk_size, d.action_dim),
        logprobs=n(T, B, *d.logprob_shape),
        values=n(T, B),
        rewards=n(T, B),
        terminated=np.zeros((T, B), bool),
        truncated=np.zeros((T, B), bool),
        final_obs={k: np.zeros_like(v) for k, v in _obs(spec, (T, B), rng).items()},
        next_obs=_obs(spec, (B,), rng),
        versions=np.zeros(T, np.int64),
        task_ids=np.zeros(B, np.int64),
        env_steps=np.array(T * B, np.int64),
        ep_returns=np.zeros(0, np.float32),
        ep_lengths=np.zeros(0, np.int32),
        ep_success=np.zeros(0, bool),
        ep_task_ids=np.zeros(0, np.int64),
        extras={},
    )
    return seg.to_tensors()


def _damaged_segment(ln, rng: np.random.Generator, i: int) -> bytes:
    t = _segment_tensors(ln, rng)
    kind = i % 9
    if kind == 0:
        return random_bytes(rng, 2000)
    if kind == 1:
        return truncated(rng, codec.encode_map(t).SerializeToString())
    name = str(rng.choice([k for k in t if t[k].size > 0]))  # emptied or reshaped, an empty one stays valid
    if kind == 2:  # wrong dtype
        t[name] = t[name].astype(np.float64 if t[name].dtype != np.float64 else np.int8)
    elif kind == 3:  # wrong shape
        t[name] = np.zeros((*t[name].shape, 2), t[name].dtype) if rng.random() < 0.5 else t[name].reshape(-1)[:1]
    elif kind == 4:  # NaN / inf in a float field
        name = str(
            rng.choice(
                ["actions", "logprobs", "values", "rewards", "obs.states", "next_obs.states", "final_obs.states"]
            )
        )
        t[name] = t[name].copy()
        t[name].reshape(-1)[int(rng.integers(0, t[name].size))] = rng.choice([np.nan, np.inf])
    elif kind == 5:  # policy versions this learner never published
        t["versions"] = np.full(4, int(rng.choice([-1, -(2**40), 10**6, 2**62])), np.int64)
    elif kind == 6:  # a tensor missing, or a well-formed segment of another run (other action size)
        if rng.random() < 0.5:
            t.pop(name)
        else:
            t["actions"] = np.zeros((*t["actions"].shape[:3], t["actions"].shape[3] + 2), np.float32)
    else:  # oversized / negative dims or a byte count that does not match, declared in the raw message
        m = codec.encode_map(t)
        victim = m.tensors[int(rng.integers(0, len(m.tensors)))]
        shape = [int(rng.choice([2**45, -3, 10**6]))] + list(victim.shape[1:])
        del victim.shape[:]
        victim.shape.extend(shape)
        return m.SerializeToString()
    return codec.encode_map(t).SerializeToString()


def _chunks(payload: bytes, segment_id: int, client: str = "fuzzer", size: int = 1 << 20):
    pieces = codec.split_chunks(payload, size)
    return [
        learner_pb2.TrajectoryChunk(
            client_id=client, segment_id=segment_id, chunk_index=i, num_chunks=len(pieces), payload=bytes(p)
        )
        for i, p in enumerate(pieces)
    ]


def _broken_chunking(ln, rng: np.random.Generator, i: int) -> list:
    chunks = _chunks(codec.encode_map(_segment_tensors(ln, rng)).SerializeToString(), 10_000 + i, size=256)
    kind = i % 4
    if kind == 0:  # one chunk missing
        del chunks[int(rng.integers(0, len(chunks)))]
    elif kind == 1:  # out of order
        chunks[0], chunks[1] = chunks[1], chunks[0]
    elif kind == 2:  # chunks of different segments in one push
        chunks[-1].segment_id += 1
    else:  # no chunks promised
        chunks = [learner_pb2.TrajectoryChunk(client_id="fuzzer", segment_id=10_000 + i, num_chunks=0)]
    return chunks


def test_learner_ingest_rejects_every_malformed_push(learner):
    rng = np.random.default_rng([SEED, 5])
    ln = learner
    with grpc.insecure_channel(ln.address) as ch:
        stub = learner_pb2_grpc.LearnerServiceStub(ch)
        raw_push = ch.stream_unary(
            "/rlfleet.v1.LearnerService/PushTrajectory",
            request_serializer=None,
            response_deserializer=learner_pb2.PushAck.FromString,
        )
        reasons_seen = set()
        for i in range(CASES):
            try:
                if i % 10 == 9:  # the chunk message itself is garbage
                    ack = raw_push(iter([random_bytes(rng, 300)]), timeout=30)
                elif i % 10 == 8:
                    ack = stub.PushTrajectory(iter(_broken_chunking(ln, rng, i)), timeout=30)
                else:
                    ack = stub.PushTrajectory(iter(_chunks(_damaged_segment(ln, rng, i), 1 + i)), timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (i, exc.code(), exc.details())
                reasons_seen.add("undecodable")
                continue
            assert not ack.accepted and ack.error, (i, ack)
        counted = ln.servicer.rejected_requests()
        assert sum(counted.values()) == CASES and ln.ingest.rejected == CASES, counted
        assert {
            "undecodable",
            "unknown_policy_version",
            "non_finite",
            "bad_dtype",
            "bad_shape",
            "protocol",
            "missing_tensor",
            "run_mismatch",
        } <= set(counted), counted
        assert "internal" not in counted, counted
        assert ln.ingest.accepted == 0 and ln.ingest.qsize() == 0  # nothing slipped through

        # over the message limit: refused by gRPC itself (the handler may also see an empty push, and count it)
        with pytest.raises(grpc.RpcError) as big:
            raw_push(iter([b"\x2a" + b"\xff" * BIG]), timeout=60)
        assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        ack = stub.PushTrajectory(
            iter(_chunks(codec.encode_map(_segment_tensors(ln, rng)).SerializeToString(), 5_000_000)), timeout=30
        )
    assert ack.accepted and not ack.duplicate, ack  # and a valid segment still goes in
    assert ln.ingest.accepted == 1 and ln.ingest.accounting()["accepted_env_steps"] == 8


# ---- the storm: every service at once-over, >= 10,000 messages, then valid requests ------------

STORM = int(os.environ.get("RLFLEET_FUZZ_STORM", "10000"))  # messages in all (seeded, bounded)
FD_BOUND = 16  # open fds the storm may leave behind (sockets still closing)
THREAD_BOUND = 16  # threads likewise (idle gRPC workers end 10 s after their last call)
RSS_BOUND_MB = 200  # resident memory it may add (allocator caches, gRPC buffers)
EXPECTED_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
}


@pytest.fixture
def env_service():
    from rlfleet.envs.api import EnvConfig
    from rlfleet.envs.env_server import EnvServerConfig, serve_env

    # the zero-cost bench env: 2 states, 2 actions, 5-step episodes (the storm tests the server, not a simulator)
    env = EnvConfig(name="bench", task="storm,state_dim=2,action_dim=2", chunk_size=2, max_episode_steps=5)
    server, port, servicer = serve_env(EnvServerConfig(env=env, max_envs=32))
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=0)
    servicer.close()


def _env_case(rng: np.random.Generator, i: int) -> tuple[str, bytes]:
    from rlfleet.wire.gen import env_pb2

    method = ["GetSpec", "Reset", "ChunkStep", "Close"][i % 4]
    kind = (i // 4) % 5
    sid = str(rng.choice(["s0", "s1", "nope", "", "x" * 300]))
    if kind == 0:
        return method, random_bytes(rng)
    if method == "GetSpec":
        req = env_pb2.SpecRequest(
            session_id=sid,
            num_envs=int(rng.choice([-5, 0, 1, 2, 40, 2**31 - 1])),
            env_offset=int(rng.choice([-1, 0, 3])),
            chunk_size=int(rng.choice([-1, 0, 2, 9])),
        )
    elif method == "Reset":
        req = env_pb2.ResetRequest(session_id=sid, seeds=[int(s) for s in rng.integers(-9, 9, int(rng.integers(0, 4)))])
    elif method == "ChunkStep":
        m = bad_obs(rng, i)
        t = m.tensors[0] if m.tensors else _tensor("actions", "float32", [2, 2, 2], b"\0" * 32)
        req = env_pb2.ChunkStepRequest(session_id=sid, actions=_tensor("actions", t.dtype, list(t.shape), t.data))
    else:
        req = env_pb2.CloseRequest(session_id=sid)
    payload = req.SerializeToString()
    return method, truncated(rng, payload) if kind == 1 and len(payload) > 1 else payload


def _attach_storm_case(rng: np.random.Generator, i: int, blk) -> list[bytes]:
    """The shared-memory attach path: valid attaches and re-attaches, act_shm, and every way to get them wrong."""
    import json

    rid = struct.pack("<Q", i + 1)
    layout = {k: [list(v.shape), v.dtype] for k, v in blk.layout.items()}
    kind = i % 8
    if kind == 0:  # valid (re-)attach
        return [b"attach", rid, json.dumps({"shm_name": blk.name, "layout": layout, "secret": blk.secret}).encode()]
    if kind == 1:  # act_shm, rows in or out of range
        lo = int(rng.integers(-2, 6))
        return [b"act_shm", rid, struct.pack("<qqq", lo, lo + int(rng.integers(-1, 6)), 0)]
    if kind == 2:  # a dtype that is not plain, or a slot of the wrong shape
        bad = dict(layout)
        bad[str(rng.choice(["values", "actions", "states"]))] = (
            [[4], str(rng.choice(["O", "U4", "V8", "complex64", ">f8", "float32"]))]
            if rng.random() < 0.5
            else [[4, int(rng.integers(0, 9))], "float32"]
        )
        return [b"attach", rid, json.dumps({"shm_name": blk.name, "layout": bad, "secret": blk.secret}).encode()]
    if kind == 3:  # wrong or missing secret, foreign names
        name = str(rng.choice([blk.name, "psm_deadbeef", "rlfleet_" + "0" * 12, "../etc", "rlfleet_a/b"]))
        return [
            b"attach",
            rid,
            json.dumps({"shm_name": name, "layout": layout, "secret": str(rng.choice(["", "00" * 16, "zz"]))}).encode(),
        ]
    if kind == 4:  # layouts that are not layouts
        junk = [None, [], "x", {"a": 1}, {"actions": [[-1], "float32"]}, {"actions": [[2**62, 2**62], "float64"]}]
        return [
            b"attach",
            rid,
            json.dumps(
                {"shm_name": blk.name, "secret": blk.secret, "layout": junk[int(rng.integers(0, len(junk)))]}
            ).encode(),
        ]
    if kind == 5:
        return [b"detach", rid]
    if kind == 6:
        return [b"attach", rid, random_bytes(rng)]
    return _zmq_case(rng, i)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="measures /proc")
def test_storm_on_every_service_leaves_them_serving(inference_server, learner, env_service):
    """>= STORM seeded messages over ZeroMQ (act and shared-memory attach), gRPC Act, LearnerService
    and EnvService; no crash, no hang (every wait is bounded), no INTERNAL, bounded fds and RSS."""
    from rlfleet.actors.inference_client import connect_inference
    from rlfleet.wire.gen import env_pb2, env_pb2_grpc
    from rlfleet.wire.shm import SharedArrays
    from rlfleet.wire.slots import slot_layout

    rng = np.random.default_rng([SEED, 99])
    env_address, env_servicer = env_service
    blk = SharedArrays.create(slot_layout(4, {"states": ((S,), "float32")}, D, K))
    blk["states"][:] = rng.normal(size=(4, S)).astype(np.float32)
    sent = {"zmq": 0, "act": 0, "learner": 0, "env": 0}
    codes: dict[str, int] = {}
    share = {"zmq": 0.4, "act": 0.25, "learner": 0.15, "env": 0.2}
    before_fds, before_rss, before_threads = _fds(), _rss_mb(), _threads()
    try:
        # ZeroMQ: act frames and the shared-memory attach path, from several connections
        socks = [zmq.Context.instance().socket(zmq.DEALER) for _ in range(4)]
        for s in socks:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(inference_server.zmq.endpoint)
        for i in range(int(STORM * share["zmq"])):
            sock = socks[i % len(socks)]
            sock.send_multipart(_attach_storm_case(rng, i, blk))
            sent["zmq"] += 1
            while sock.poll(0 if i % 8 == 1 else 30_000):  # act_shm answers may come later: drain what is there
                reply = sock.recv_multipart()
                assert reply[0] in (b"ok", b"done", b"error"), reply[:1]
                if i % 8 != 1:
                    break
        for s in socks:
            s.close()

        # gRPC Act: damaged requests on long streams, undecodable ones on their own streams
        with grpc.insecure_channel(inference_server.address) as ch:
            raw_act = ch.stream_stream(
                "/rlfleet.v1.InferenceService/Act",
                request_serializer=None,
                response_deserializer=inference_pb2.ActResponse.FromString,
            )
            n_act = int(STORM * share["act"])
            batch = [
                inference_pb2.ActRequest(request_id=j + 1, obs=bad_obs(rng, j)).SerializeToString()
                for j in range(n_act - n_act // 10)
            ]
            replies = list(raw_act(iter(batch), timeout=120))
            assert len(replies) == len(batch) and all(r.error for r in replies)
            sent["act"] += len(batch)
            for j in range(n_act // 10):
                try:
                    list(raw_act(iter([_grpc_case(rng, 7 * j)]), timeout=30))
                except grpc.RpcError as exc:
                    codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                    assert exc.code() in EXPECTED_CODES, (exc.code(), exc.details())
                sent["act"] += 1

        # LearnerService: damaged pushes, broken chunking, garbage on every method
        with grpc.insecure_channel(learner.address) as ch:
            stub = learner_pb2_grpc.LearnerServiceStub(ch)
            methods = {
                m: ch.unary_unary(
                    f"/rlfleet.v1.LearnerService/{m}", request_serializer=None, response_deserializer=None
                )
                for m in ("Register", "Heartbeat")
            }
            streams = {
                m: ch.unary_stream(
                    f"/rlfleet.v1.LearnerService/{m}", request_serializer=None, response_deserializer=None
                )
                for m in ("PullWeights", "WatchWeights")
            }
            raw_push = ch.stream_unary(
                "/rlfleet.v1.LearnerService/PushTrajectory",
                request_serializer=None,
                response_deserializer=learner_pb2.PushAck.FromString,
            )
            for i in range(int(STORM * share["learner"])):
                try:
                    if i % 5 == 0:
                        stub.PushTrajectory(iter(_chunks(_damaged_segment(learner, rng, i), 100_000 + i)), timeout=30)
                    elif i % 5 == 1:
                        raw_push(iter([random_bytes(rng, 300)]), timeout=30)
                    elif i % 5 == 2:
                        methods[str(rng.choice(list(methods)))](random_bytes(rng), timeout=30)
                    elif i % 5 == 3:  # (random bytes that decode are a valid watch, which waits: never those)
                        which = str(rng.choice(list(streams)))
                        list(streams[which](random_bytes(rng) if which == "PullWeights" else b"\xff" * 11, timeout=30))
                    else:  # heartbeats from ids nobody registered
                        stub.Heartbeat(learner_pb2.HeartbeatRequest(client_id=f"storm{i}"), timeout=30)
                except grpc.RpcError as exc:
                    codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                    assert exc.code() in EXPECTED_CODES, (i, exc.code(), exc.details())
                sent["learner"] += 1

        # EnvService: garbage and damaged requests on every method
        with grpc.insecure_channel(env_address) as ch:
            raw = {
                m: ch.unary_unary(f"/rlfleet.v1.EnvService/{m}", request_serializer=None, response_deserializer=None)
                for m in ("GetSpec", "Reset", "ChunkStep", "Close")
            }
            for i in range(int(STORM * share["env"])):
                method, payload = _env_case(rng, i)
                try:
                    raw[method](payload, timeout=30)
                except grpc.RpcError as exc:
                    codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                    assert exc.code() in EXPECTED_CODES, (i, method, exc.code(), exc.details())
                sent["env"] += 1

        assert sum(sent.values()) >= STORM, sent
        # counted by reason, never as internal errors
        inference_counts = inference_server.rejected_requests()
        assert "internal" not in inference_counts and sum(inference_counts.values()) > 0, inference_counts
        assert "internal" not in learner.servicer.rejected_requests()
        assert learner.servicer.rejected_calls().get("undecodable", 0) > 0
        assert "INTERNAL" not in env_servicer.errors and env_servicer.rejections.snapshot().get("undecodable", 0) > 0
        assert codes.get("INVALID_ARGUMENT", 0) > 0 and "INTERNAL" not in codes and "UNKNOWN" not in codes, codes

        # valid requests still work, on every path
        for transport in ("shm", "zmq", "grpc"):
            client = connect_inference(transport, inference_server.address, blk)
            client.submit(0, 0, 4, deterministic=True)
            assert client.wait(0) == 3, transport
            client.close()
        ack = learner_pb2_grpc.LearnerServiceStub(grpc.insecure_channel(learner.address)).PushTrajectory(
            iter(_chunks(codec.encode_map(_segment_tensors(learner, rng)).SerializeToString(), 9_000_000)), timeout=30
        )
        assert ack.accepted, ack
        with grpc.insecure_channel(env_address) as ch:
            env = env_pb2_grpc.EnvServiceStub(ch)
            env.GetSpec(env_pb2.SpecRequest(session_id="after", num_envs=2), timeout=30)
            env.Reset(env_pb2.ResetRequest(session_id="after"), timeout=30)
            step = env.ChunkStep(
                env_pb2.ChunkStepRequest(
                    session_id="after", actions=codec.encode_tensor("actions", np.zeros((2, 2, 2), np.float32))
                ),
                timeout=30,
            )
        assert codec.decode_map(step.obs)["states"].shape == (2, 2)
    finally:
        blk.close()
    deadline = time.monotonic() + 60  # closed connections are reaped soon, idle gRPC workers in 10 s
    while (_fds() - before_fds >= FD_BOUND or _threads() - before_threads >= THREAD_BOUND) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert _fds() - before_fds < FD_BOUND, (before_fds, _fds())
    assert _threads() - before_threads < THREAD_BOUND, (before_threads, _threads())
    assert _rss_mb() - before_rss < RSS_BOUND_MB, (before_rss, _rss_mb())
    print(
        f"storm: {sent} messages, fds {before_fds} -> {_fds()}, threads {before_threads} -> {_threads()},"
        f" RSS {before_rss:.0f} -> {_rss_mb():.0f} MB"
    )


# ---- the last holes: truncated blocks, tokenless stream floods, poisoned and oversized ledgers ------


def _shm_truncate(name: str, size: int) -> None:
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="measures /proc")
def test_storm_of_truncated_blocks_poisoned_ledgers_huge_ids_and_tokenless_streams(
    inference_server, learner, env_service
):
    """Each case of issue 51 under seeded random input: the services answer, count, and keep serving."""
    import json

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from rlfleet.learner.losses import read_ledger
    from rlfleet.learner.service import MAX_CLIENT_ID_BYTES
    from rlfleet.wire.auth import AuthConfig
    from rlfleet.wire.gen import env_pb2, env_pb2_grpc
    from rlfleet.wire.grpc_limits import StreamLimits
    from rlfleet.wire.grpc_server import make_channel, start_grpc_server
    from rlfleet.wire.shm import SharedArrays
    from rlfleet.wire.slots import slot_layout

    rng = np.random.default_rng([SEED, 51])
    before_rss = _rss_mb()

    # 1. blocks truncated by their owner between two act_shm (to 0, 64 bytes, or a random size)
    n = 512  # many pages: a mapping would fault on every page past the new end
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(inference_server.zmq.endpoint)
    for i in range(12):
        blk = SharedArrays.create(slot_layout(n, {"states": ((S,), "float32")}, D, K))
        try:
            lay = {k: [list(v.shape), v.dtype] for k, v in blk.layout.items()}
            sock.send_multipart(
                [
                    b"attach",
                    struct.pack("<Q", i),
                    json.dumps({"shm_name": blk.name, "layout": lay, "secret": blk.secret}).encode(),
                ]
            )
            assert sock.poll(30_000) and sock.recv_multipart()[0] == b"ok"
            _shm_truncate(blk.name, int(rng.choice([0, 64, int(rng.integers(0, blk.shm.size))])))
            for _ in range(3):
                lo = int(rng.integers(0, n))
                sock.send_multipart([b"act_shm", struct.pack("<Q", i), struct.pack("<qqq", lo, n, 0)])
                assert sock.poll(30_000)
                reply = sock.recv_multipart()
                assert reply[0] == b"error" and b"truncated" in reply[2], reply
        finally:
            blk.close()
    sock.close()
    assert inference_server.rejected_requests().get("block_truncated", 0) >= 36

    # 2. poisoned life reports, 3. ids of 1 MiB, 4. thousands of lives ended
    with grpc.insecure_channel(learner.address) as ch:
        stub = learner_pb2_grpc.LearnerServiceStub(ch)
        stub.Register(learner_pb2.RegisterRequest(client_id="poison", role="actor"), timeout=30)
        extremes = [0, 1, -1, 2**62, -(2**62), 2**63 - 1, -(2**63)]
        lives = [0, 1, 0xBADBAD, 2**31 - 1, 2**40, 2**64 - 1]

        def pick(values: list[int]) -> int:  # by index: numpy would turn 2^64 - 1 into a float
            return values[int(rng.integers(0, len(values)))]

        for i in range(300):
            report = learner_pb2.LifeReport(
                life=pick(lives),
                env_steps=pick(extremes),
                accepted_env_steps=pick(extremes),
                rejected_env_steps=pick(extremes),
                crashed=bool(i % 2),
            )
            stub.Heartbeat(learner_pb2.HeartbeatRequest(client_id="poison", ended=report), timeout=30)
        lost = learner.losses.by_cause()
        assert sum(lost.values()) <= 300 * learner.losses.life_slack, lost  # no 2^62 got in
        assert learner.servicer.rejected_calls().get("bad_life_report", 0) > 0
        huge = "x" * (1 << 20)
        for i in range(40):
            with pytest.raises(grpc.RpcError) as err:
                (stub.Register if i % 2 else stub.Heartbeat)(
                    learner_pb2.RegisterRequest(client_id=huge + str(i), role="actor")
                    if i % 2
                    else learner_pb2.HeartbeatRequest(client_id=huge + str(i)),
                    timeout=30,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert all(len(c) <= MAX_CLIENT_ID_BYTES for c in learner.servicer._clients)
        # a Register flood of random new ids from this host: a burst, then refusals counted
        from rlfleet.learner.service import REGISTER_BURST

        flood_refused = 0
        for i in range(REGISTER_BURST + 300):
            try:
                stub.Register(
                    learner_pb2.RegisterRequest(client_id=f"flood-{i}-{rng.integers(1 << 30)}", role="actor"),
                    timeout=30,
                )
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                flood_refused += 1
        assert flood_refused > 0 and learner.servicer.rejected_calls().get("register_rate", 0) == flood_refused
        # registered: the module's earlier storms may have filled the table of ids adopted from heartbeats
        time.sleep(1.0)  # a token of this host's Register rate back for one more new id
        stub.Register(learner_pb2.RegisterRequest(client_id="many", role="actor"), timeout=30)
        for life in range(1, 3001):
            stub.Heartbeat(
                learner_pb2.HeartbeatRequest(client_id="many", ended=learner_pb2.LifeReport(life=life, env_steps=1)),
                timeout=30,
            )
    state = read_ledger(learner.checkpointer.root)
    assert len([k for k in state["lives"] if k.startswith("many/")]) <= 64 and state["folded_lives"] >= 3000 - 64
    assert (learner.checkpointer.root / "env_step_ledger.json").stat().st_size < 1 << 20

    # 5. a negative session seed
    with grpc.insecure_channel(env_service[0]) as ch:
        with pytest.raises(grpc.RpcError) as err:
            env_pb2_grpc.EnvServiceStub(ch).GetSpec(
                env_pb2.SpecRequest(session_id="neg", num_envs=2, seed=-1), timeout=30
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # 6. with a token set, more tokenless health streams than the whole stream budget
    auth = AuthConfig(token="fuzz-token")
    server, port = start_grpc_server(
        "127.0.0.1",
        0,
        [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(learner.servicer, s)],
        ["rlfleet.v1.LearnerService"],
        auth=auth,
        limits=StreamLimits(max_streams=32, idle_s=600),
    )
    stranger = grpc.insecure_channel(f"127.0.0.1:{port}")
    watches = [health_pb2_grpc.HealthStub(stranger).Watch(health_pb2.HealthCheckRequest()) for _ in range(40)]
    try:
        deadline = time.monotonic() + 60
        while server.stream_budget.open_streams < StreamLimits.max_open_streams and time.monotonic() < deadline:
            time.sleep(0.05)
        with make_channel(f"127.0.0.1:{port}", auth) as mine:
            pushes = [
                learner_pb2_grpc.LearnerServiceStub(mine).PushTrajectory.future(
                    iter([learner_pb2.TrajectoryChunk(client_id="a", segment_id=j + 1, num_chunks=1, payload=b"\xff")]),
                    timeout=30,
                )
                for j in range(8)
            ]
            assert all(not p.result().accepted and p.result().error for p in pushes)  # answered, not exhausted
    finally:
        for w in watches:
            w.cancel()
        stranger.close()
        server.stop(grace=0)

    assert _rss_mb() - before_rss < RSS_BOUND_MB, (before_rss, _rss_mb())
