"""EnvService under bad bytes, slow simulators and session churn: clean errors, no global stall, bounded memory."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.bench_env import BenchEnv
from rlfleet.envs.env_server import EnvServerConfig, EnvServicer, serve_env
from rlfleet.envs.registry import register_env
from rlfleet.wire import codec
from rlfleet.wire.gen import env_pb2, env_pb2_grpc

BUILD_GATE = threading.Event()  # a session with seed 13 waits for it while its env is built


class TinyEnv(BenchEnv):
    """The zero-cost bench env, whose construction waits for BUILD_GATE when seeded 13 (a slow simulator start)."""

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0):
        if cfg.seed == 13:
            assert BUILD_GATE.wait(60), "test never opened the gate"
        super().__init__(cfg, num_envs, env_offset)


register_env("hardening-tiny", TinyEnv)


@pytest.fixture
def served():
    cfg = EnvServerConfig(
        env=EnvConfig(name="hardening-tiny", task="tiny,state_dim=2,action_dim=2", chunk_size=2, max_episode_steps=5),
        max_envs=16,
    )
    server, port, servicer = serve_env(cfg)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield servicer, channel
    BUILD_GATE.set()
    channel.close()
    server.stop(grace=0)
    servicer.close()


def test_undecodable_bytes_get_invalid_argument_and_are_counted(served):
    servicer, channel = served
    for method in ("GetSpec", "Reset", "ChunkStep", "Close"):
        call = channel.unary_unary(
            f"/rlfleet.v1.EnvService/{method}", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.RpcError) as err:
            call(b"\xff\xff\xff\xff garbage", timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.code())
    assert servicer.rejections.snapshot() == {"undecodable": 4}
    assert dict(servicer.errors) == {"INVALID_ARGUMENT": 4}


def test_a_slow_env_build_does_not_stall_other_sessions(served):
    servicer, channel = served
    stub = env_pb2_grpc.EnvServiceStub(channel)
    stub.GetSpec(env_pb2.SpecRequest(session_id="fast", num_envs=2), timeout=30)
    BUILD_GATE.clear()
    slow = stub.GetSpec.future(env_pb2.SpecRequest(session_id="slow", num_envs=2, seed=13), timeout=60)
    try:
        # while "slow" is being built: other sessions open, reset, step and close
        stub.GetSpec(env_pb2.SpecRequest(session_id="other", num_envs=2), timeout=20)
        stub.Reset(env_pb2.ResetRequest(session_id="fast"), timeout=20)
        actions = codec.encode_tensor("actions", np.zeros((2, 2, 2), np.float32))
        stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="fast", actions=actions), timeout=20)
        stub.Close(env_pb2.CloseRequest(session_id="other"), timeout=20)
        assert not slow.done()
    finally:
        BUILD_GATE.set()
    assert slow.result(timeout=60).num_envs == 2
    assert set(servicer.sessions) == {"fast", "slow"}


def test_a_session_over_the_env_budget_is_refused_while_another_is_being_built(served):
    servicer, channel = served
    stub = env_pb2_grpc.EnvServiceStub(channel)
    BUILD_GATE.clear()
    slow = stub.GetSpec.future(env_pb2.SpecRequest(session_id="slow", num_envs=10, seed=13), timeout=60)
    deadline = time.monotonic() + 30
    while servicer._reserved == 0 and time.monotonic() < deadline:  # the slow build has reserved its envs
        time.sleep(0.01)
    try:
        with pytest.raises(grpc.RpcError) as err:  # 10 reserved + 10 > 16
            stub.GetSpec(env_pb2.SpecRequest(session_id="big", num_envs=10), timeout=20)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        BUILD_GATE.set()
    slow.result(timeout=60)
    assert servicer.rejections.snapshot() == {"resource_exhausted": 1}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


@pytest.mark.slow  # MetaWorld builds take seconds each on a shared CPU
def test_sessions_opened_and_closed_do_not_grow_the_server():
    pytest.importorskip("metaworld")
    cfg = EnvServerConfig(env=EnvConfig(name="metaworld", task="reach-v3", max_episode_steps=20, image_size=0))
    servicer = EnvServicer(cfg)
    for i in range(3):  # warm up: imports, first-use caches
        servicer._open(env_pb2.SpecRequest(session_id=f"w{i}", num_envs=2))
        servicer._close_session(f"w{i}")
    before = _rss_mb()
    for i in range(12):
        servicer._open(env_pb2.SpecRequest(session_id=f"s{i}", num_envs=2))
        servicer._reset(env_pb2.ResetRequest(session_id=f"s{i}"))
        servicer._close_session(f"s{i}")
    grown = _rss_mb() - before
    assert not servicer.sessions
    assert grown < 40, f"RSS grew {grown:.0f} MB over 12 sessions"  # was about 30 MB per session


@pytest.mark.parametrize("seed", [-1, -(2**63)])
def test_a_negative_session_seed_is_refused_at_getspec(served, seed):
    """Was: GetSpec(seed=-1) opened the session and every later Reset without seeds failed."""
    servicer, channel = served
    stub = env_pb2_grpc.EnvServiceStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetSpec(env_pb2.SpecRequest(session_id="neg", num_envs=2, seed=seed), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "seed" in err.value.details()
    assert "neg" not in servicer.sessions
    stub.GetSpec(env_pb2.SpecRequest(session_id="neg", num_envs=2, seed=2**63 - 1), timeout=30)
    stub.Reset(env_pb2.ResetRequest(session_id="neg"), timeout=30)  # the largest seed works
