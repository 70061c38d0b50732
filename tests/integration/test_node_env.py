"""A simulator written in Node.js (examples/node_env) behind EnvService: health, contract, and PPO learns on it.

Skipped, with the reason, where `node` is missing or its packages cannot be installed (`npm ci`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import make_env
from rlfleet.wire.grpc_server import make_channel

NODE_ENV = Path(__file__).resolve().parents[2] / "examples" / "node_env"


def _node_ready() -> str:
    """Path of `node` once the example's packages are installed; skips the module otherwise."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node.js EnvService example cannot run")
    if not (NODE_ENV / "node_modules" / "@grpc" / "grpc-js").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: cannot install examples/node_env's packages")
        try:
            res = subprocess.run(
                [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                cwd=NODE_ENV,
                capture_output=True,
                text=True,
                timeout=300,
            )
        except subprocess.TimeoutExpired:
            pytest.skip("`npm ci` in examples/node_env took over 300 s (no access to the npm registry?)")
        if res.returncode != 0:
            pytest.skip(f"`npm ci` in examples/node_env failed (no access to the npm registry?): {res.stderr[-500:]}")
    return node


@pytest.fixture(scope="module")
def node_server(tmp_path_factory):
    node = _node_ready()
    tmp = tmp_path_factory.mktemp("node_env")
    addr_file, log_path = tmp / "env.json", tmp / "node.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [node, str(NODE_ENV / "server.js"), "--port", "0", "--address-file", str(addr_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not addr_file.exists():
            assert proc.poll() is None, f"server.js exited:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"server.js did not start:\n{log_path.read_text()}"
            time.sleep(0.1)
        yield json.loads(addr_file.read_text())["env"], proc, log_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _remote(address: str, **kw) -> EnvConfig:
    return EnvConfig(name=f"remote://{address}?connect_timeout=30&timeout=30", **kw)


def test_health_check_passes(node_server):
    address, _, _ = node_server
    with make_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rlfleet.v1.EnvService"), timeout=30
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_node_env_keeps_the_env_contract(node_server):
    address, proc, _ = node_server
    with (
        make_env(_remote(address, chunk_size=3), 4, env_offset=2) as env,
        make_env(_remote(address, chunk_size=3), 4) as twin,
    ):
        spec = env.spec
        assert (spec.state_dim, spec.action_dim, spec.chunk_size, spec.num_envs) == (4, 2, 3, 4)
        assert env.task_list == ["reach2d"] and spec.task_names == ["reach2d"] * 4
        obs = env.reset(np.arange(4))
        np.testing.assert_array_equal(obs["states"], twin.reset(np.arange(4))["states"])  # seeds decide episodes
        assert obs["states"].dtype == np.float32 and np.abs(obs["states"][:, :2]).max() <= 1.0
        assert obs["instructions"].shape == (4, 128) and obs["task_ids"].tolist() == [0] * 4  # derived client-side
        done_once = np.zeros(4, bool)
        for _ in range(40):  # head for the goal: every env succeeds, some mid-chunk (auto-reset)
            s = obs["states"]
            act = np.repeat(np.clip(s[:, 2:] * 10, -1, 1)[:, None], 3, axis=1)  # states: point, offset to goal
            res = env.chunk_step(act)
            assert res.rewards.shape == (4, 3)
            ended = res.episode_done
            assert (res.terminated[ended] & res.episode_success_once[ended]).all()
            assert (np.linalg.norm(res.final_obs["states"][ended, 2:], axis=1) < 0.15).all()
            done_once |= ended
            obs = res.obs
        assert done_once.all()
        with pytest.raises(ValueError, match=r"shape \[4,3,3\], expected \[4,3,2\]"):
            env.chunk_step(np.zeros((4, 3, 3), np.float32))
        with pytest.raises(ValueError, match="NaN or inf"):
            env.chunk_step(np.full((4, 3, 2), np.inf, np.float32))
        env.chunk_step(np.zeros((4, 3, 2), np.float32))  # still serving this session
    assert proc.poll() is None


def test_node_env_numbers_its_steps(node_server):
    """step_seq: a repeated number is answered again without stepping, a skipped one is refused."""
    import grpc

    from rlfleet.wire import codec
    from rlfleet.wire.gen import env_pb2, env_pb2_grpc

    address, _, _ = node_server
    with make_channel(address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        stub.GetSpec(env_pb2.SpecRequest(session_id="seq", num_envs=2, chunk_size=1), timeout=30)
        stub.Reset(env_pb2.ResetRequest(session_id="seq", seeds=[1, 2]), timeout=30)
        act = codec.encode_tensor("actions", np.ones((2, 1, 2), np.float32))
        first = stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="seq", actions=act, step_seq=1), timeout=30)
        again = stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="seq", actions=act, step_seq=1), timeout=30)
        assert first.step_seq == 1 and again == first
        with pytest.raises(grpc.RpcError) as err:
            stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="seq", actions=act, step_seq=3), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "expected 2" in err.value.details()
        second = stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="seq", actions=act, step_seq=2), timeout=30)
        assert second.step_seq == 2
        moved = codec.decode_map(second.obs)["states"] != codec.decode_map(first.obs)["states"]
        assert moved.any()  # a real second step
        stub.Close(env_pb2.CloseRequest(session_id="seq"), timeout=30)


def test_ppo_learns_on_the_node_simulator(node_server, tmp_path):
    """`rlfleet train` in local mode, env steps over gRPC to Node: deterministic success must rise."""
    address, _, _ = node_server
    run = tmp_path / "run"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlfleet.cli",
            "train",
            "node_reach2d_ppo",
            f"env.name=remote://{address}",
            "runner.total_env_steps=10000",
            "runner.max_wall_seconds=150",
            f"runner.logger.log_path={run}",
        ],
        capture_output=True,
        text=True,
        timeout=420,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["reach2d"], summary["eval_success"]["reach2d"]
    assert after >= 0.5 and after >= before + 0.3, summary
