"""`rlfleet env-server` serving MetaWorld (state-only reach-v3) as a real process on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import make_env
from rlfleet.wire import codec
from rlfleet.wire.gen import env_pb2, env_pb2_grpc
from rlfleet.wire.grpc_server import make_channel

STEPS = 20  # episode length: the 30 chunks below cross episode ends (auto-reset, final_obs)


@pytest.fixture(scope="module")
def env_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("env_server")
    addr_file = tmp / "env.json"
    log = open(tmp / "env_server.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet.cli",
            "env-server",
            "--env",
            "metaworld",
            "--task",
            "reach-v3",
            "--address-file",
            str(addr_file),
            f"max_episode_steps={STEPS}",
            "image_size=0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not addr_file.exists():
            assert proc.poll() is None, (tmp / "env_server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "env-server did not start"
            time.sleep(0.1)
        import json

        yield json.loads(addr_file.read_text())["env"], proc, tmp / "env_server.log"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _cfg(address: str | None = None, **kw) -> EnvConfig:
    name = f"remote://{address}?connect_timeout=60&timeout=60" if address else "metaworld"
    return EnvConfig(name=name, task="reach-v3", max_episode_steps=STEPS, **kw)


def test_health_and_reflection_come_with_the_server(env_server):
    address, _, _ = env_server
    with make_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service="rlfleet.v1.EnvService"), timeout=30)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_remote_metaworld_equals_local(env_server):
    address, _, _ = env_server
    local = make_env(_cfg(seed=3), 2, env_offset=1)
    remote = make_env(_cfg(address, seed=3), 2, env_offset=1)
    try:
        assert remote.spec == local.spec and remote.task_list == ["reach-v3"]
        for seeds in (None, np.array([11, 12])):  # the session's own seeds, then explicit ones
            a, b = remote.reset(seeds), local.reset(seeds)
            np.testing.assert_array_equal(a["states"], b["states"])
            np.testing.assert_array_equal(a["instructions"], b["instructions"])
            assert a["task_descriptions"] == b["task_descriptions"]
            rng = np.random.default_rng(0)
            ends = 0
            for _ in range(30):
                act = rng.uniform(-1, 1, (2, 1, 4)).astype(np.float32)
                ra, rb = remote.chunk_step(act), local.chunk_step(act)
                np.testing.assert_array_equal(ra.obs["states"], rb.obs["states"])
                np.testing.assert_array_equal(ra.rewards, rb.rewards)
                for name in (
                    "terminated",
                    "truncated",
                    "success",
                    "episode_done",
                    "episode_return",
                    "episode_length",
                    "episode_success_once",
                ):
                    np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name), err_msg=name)
                assert set(ra.final_obs) == set(rb.final_obs)
                for key in rb.final_obs:
                    np.testing.assert_array_equal(ra.final_obs[key], rb.final_obs[key])
                ends += int(ra.episode_done.sum())
            assert ends == 2  # each env finished an episode (and auto-reset) exactly once
    finally:
        remote.close()
        local.close()


def test_bad_requests_get_clear_statuses_and_the_server_keeps_serving(env_server):
    address, proc, log = env_server
    with make_channel(address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)

        def status(call, request) -> tuple[grpc.StatusCode, str]:
            with pytest.raises(grpc.RpcError) as err:
                call(request, timeout=60)
            return err.value.code(), err.value.details()

        code, msg = status(stub.Reset, env_pb2.ResetRequest(session_id="h"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "call GetSpec" in msg
        spec = stub.GetSpec(env_pb2.SpecRequest(session_id="h", num_envs=2, chunk_size=1), timeout=60)
        assert (spec.num_envs, spec.state_dim, spec.action_dim, spec.env_name) == (2, 39, 4, "metaworld")
        assert [(o.key, o.dtype, list(o.shape)) for o in spec.observations] == [
            ("states", "float32", [39]),
            ("instructions", "uint8", [128]),
        ]

        def step(arr):
            return env_pb2.ChunkStepRequest(session_id="h", actions=codec.encode_tensor("actions", arr))

        code, msg = status(stub.ChunkStep, step(np.zeros((2, 1, 4), np.float32)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "call Reset" in msg
        stub.Reset(env_pb2.ResetRequest(session_id="h", seeds=[1, 2]), timeout=60)
        for arr, expect in [
            (np.zeros((2, 1, 3), np.float32), "shape [2, 1, 3], expected [2, 1, 4]"),
            (np.zeros((2, 1, 4), np.float64), "dtype float64, expected float32"),
            (np.full((2, 1, 4), np.nan, np.float32), "NaN or inf"),
        ]:
            code, msg = status(stub.ChunkStep, step(arr))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and expect in msg, msg
        garbled = env_pb2.ChunkStepRequest(
            session_id="h", actions=codec.encode_tensor("actions", np.zeros((2, 1, 4), np.float32))
        )
        garbled.actions.data = garbled.actions.data[:-3]
        code, msg = status(stub.ChunkStep, garbled)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "bytes of data" in msg
        code, msg = status(stub.Reset, env_pb2.ResetRequest(session_id="h", seeds=[1, 2, 3]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "3 seeds" in msg
        reply = stub.ChunkStep(step(np.zeros((2, 1, 4), np.float32)), timeout=60)  # the session still works
        assert codec.decode_map(reply.step)["rewards"].shape == (2, 1)
        stub.Close(env_pb2.CloseRequest(session_id="h"), timeout=60)
    assert proc.poll() is None
    assert "rejected ChunkStep (INVALID_ARGUMENT)" in log.read_text()


def test_evaluation_runs_on_a_remote_env(env_server):
    """`evaluate_policy` (what `rlfleet eval` and the learner run) takes a remote env name too."""
    import torch

    from rlfleet.eval.episodes import evaluate_policy
    from rlfleet.policies.registry import make_policy

    torch.manual_seed(0)
    policy = make_policy({"name": "gaussian_mlp", "hidden_sizes": [8]}, 39, 4, 1)
    address, _, _ = env_server
    remote = evaluate_policy(policy, _cfg(address), episodes_per_task=2, seed=50)
    local = evaluate_policy(policy, _cfg(), episodes_per_task=2, seed=50)
    assert remote == local and list(remote) == ["reach-v3"]


def test_sigint_stops_the_server_cleanly(tmp_path):
    addr_file = tmp_path / "env.json"
    proc = subprocess.Popen(
        [
            *[sys.executable, "-m", "rlfleet.cli", "env-server", "--env", "metaworld", "--task", "reach-v3"],
            *["--address-file", str(addr_file)],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not addr_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-2000:]
    assert "env server stopped" in out


def test_env_server_rejects_a_bad_config(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "env-server", "--env", "metaworld", "--task", "nope-v3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "unknown MetaWorld task" in res.stderr
    res = subprocess.run(  # no --task: MetaWorld names no default of its own (EnvConfig.task is empty)
        [sys.executable, "-m", "rlfleet.cli", "env-server", "--env", "metaworld"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "env.task is empty: name a MetaWorld task" in res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "env-server", "--env", "metaworld", "colour=red"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "bad env override" in res.stderr


def test_eval_points_at_an_env_address_and_a_gone_server_is_one_line(env_server, tmp_path, caplog):
    """`rlfleet eval`: --env-address picks the server; --task on a remote env is refused, not ignored;
    a server that is gone is one error line (exit 2), not a traceback."""
    import dataclasses

    import torch

    from rlfleet.cli import main
    from rlfleet.policies.checkpoint_io import model_config, save_checkpoint_folder
    from rlfleet.policies.registry import make_policy

    torch.manual_seed(0)
    policy_cfg = {"name": "gaussian_mlp", "hidden_sizes": [8]}
    gone = dataclasses.asdict(EnvConfig(name="remote://127.0.0.1:1?connect_timeout=1", max_episode_steps=STEPS))
    ckpt = tmp_path / "ckpt"
    save_checkpoint_folder(ckpt, make_policy(policy_cfg, 39, 4, 1), model_config(policy_cfg, 39, 4, 1, gone))
    address, _, _ = env_server
    out = tmp_path / "report"
    with caplog.at_level("ERROR"):
        assert main(["eval", str(ckpt), "--episodes", "1"]) == 2
        assert main(["eval", str(ckpt), "--task", "MT10"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("env server 127.0.0.1:1 unreachable" in e for e in errors), errors
    assert any("--task MT10 cannot apply to the remote env" in e for e in errors), errors
    assert main(["eval", str(ckpt), "--env-address", address, "--episodes", "1", "--out", str(out)]) == 0
    import json

    assert [t["task"] for t in json.loads((out / "eval.json").read_text())["tasks"]] == ["reach-v3"]
