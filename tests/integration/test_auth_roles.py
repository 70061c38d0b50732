"""The three roles as separate processes with a token, bound to 0.0.0.0: they train; outsiders are refused."""

from __future__ import annotations

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc

TOKEN = "integration-token-0123456789"


def _via_loopback(address: str) -> str:
    """Servers bound to 0.0.0.0 report that; the test reaches them through 127.0.0.1 only."""
    return "127.0.0.1:" + address.rpartition(":")[2]


def test_roles_with_a_token_train_and_refuse_outsiders(roles, tmp_path, monkeypatch):
    monkeypatch.setenv("RLFLEET_TOKEN", TOKEN)  # the roles read it from their environment
    monkeypatch.setenv("RLFLEET_HOST", "0.0.0.0")  # every server binds the wildcard: allowed with a token
    run = tmp_path / "run"
    learner, laddr = roles.learner(run, "runner.total_env_steps=256", "eval.at_end=false")
    assert laddr.startswith("0.0.0.0:")
    laddr = _via_loopback(laddr)
    inference, iaddr = roles.inference(laddr)
    iaddr = _via_loopback(iaddr)

    with grpc.insecure_channel(laddr) as ch:  # no token: health answers, the learner service does not
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            learner_pb2_grpc.LearnerServiceStub(ch).Heartbeat(
                learner_pb2.HeartbeatRequest(client_id="outsider"), timeout=30
            )
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

    monkeypatch.setenv("RLFLEET_TOKEN", "not-the-token")
    intruder = roles.actor("actor-intruder", laddr, iaddr, "zmq")
    monkeypatch.setenv("RLFLEET_TOKEN", TOKEN)
    actor = roles.actor("actor-zmq", laddr, iaddr, "zmq")

    assert roles.wait(intruder, "actor-intruder", 180) == 2, roles.log("actor-intruder")[-3000:]
    assert "refused this process's credentials" in roles.log("actor-intruder")
    assert roles.wait(learner, "learner", 300) == 0, roles.log("learner")[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 2 and summary["env_steps"] >= 256
    assert (
        summary["segments_by_client"].get("actor-zmq", 0) > 0 and "actor-intruder" not in summary["segments_by_client"]
    )
    for name, proc in (("inference", inference), ("actor-zmq", actor)):
        assert roles.wait(proc, name, 90) == 0, roles.log(name)[-3000:]
    assert TOKEN not in roles.log("learner") + roles.log("inference") + roles.log("actor-zmq")
