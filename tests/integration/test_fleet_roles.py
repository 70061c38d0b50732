"""The three roles started one by one, over every transport, with an actor killed mid-run and a resume."""

from __future__ import annotations

import json
import time

import grpc
import yaml

from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc


def _learner_version(addr: str) -> int:
    with grpc.insecure_channel(addr) as ch:
        reply = learner_pb2_grpc.LearnerServiceStub(ch).Heartbeat(
            learner_pb2.HeartbeatRequest(client_id="test"), timeout=5
        )
        return reply.policy_version


def test_roles_one_by_one_over_shm_zmq_and_grpc(roles, tmp_path):
    run = tmp_path / "run"
    # enough steps that an actor whose imports are slow on a busy machine still joins in time
    learner, laddr = roles.learner(run, "runner.total_env_steps=2400")
    inference, iaddr = roles.inference(laddr)
    actors = {t: roles.actor(f"actor-{t}", laddr, iaddr, t) for t in ("shm", "zmq", "grpc")}
    assert roles.wait(learner, "learner", 300) == 0, roles.log("learner")[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] >= 2400
    assert summary["version"] == summary["updates"] >= 2400 // 64 - 1
    # the inference server followed the weights: samples stay within a few versions of the
    # learner (queues hold ~4 updates' worth here); a server stuck on old weights would lag ~18
    assert summary["policy_lag_last_update"] <= 8, summary
    for t in actors:  # every transport delivered data that the learner trained on
        assert summary["segments_by_client"].get(f"actor-{t}", 0) > 0, summary
    assert set(summary["eval_success"]) == {"reach-v3"}
    assert (run / "checkpoints" / "latest").read_text().startswith("update_")
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    for name, proc in [("inference", inference), *((f"actor-{t}", p) for t, p in actors.items())]:
        assert roles.wait(proc, name, 60) == 0, roles.log(name)[-3000:]  # they all stop by themselves


def test_killed_actor_does_not_stop_the_others_and_resume_continues(roles, tmp_path):
    run = tmp_path / "run"
    learner, laddr = roles.learner(run, "runner.total_env_steps=2400", "eval.at_end=false")
    _, iaddr = roles.inference(laddr)
    victim = roles.actor("actor-victim", laddr, iaddr, "shm")
    survivor = roles.actor("actor-survivor", laddr, iaddr, "shm")
    deadline = time.monotonic() + 180
    while _learner_version(laddr) < 3:
        assert time.monotonic() < deadline, roles.log("learner")[-3000:]
        time.sleep(0.2)
    roles.kill_group(victim)  # the actor and its env workers die at once, mid-segment
    victim.wait(10)
    killed_at = _learner_version(laddr)
    assert roles.wait(learner, "learner", 240) == 0, roles.log("learner")[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["version"] >= killed_at + 5  # training went on without the victim
    assert summary["segments_by_client"]["actor-survivor"] > summary["segments_by_client"].get("actor-victim", 0)
    assert roles.wait(survivor, "actor-survivor", 60) == 0

    first_version = summary["version"]
    checkpointed = _checkpointed_env_steps(run)
    learner2, laddr2 = roles.learner(run, "runner.total_env_steps=3000", "eval.at_end=false", resume=True)
    _, iaddr2 = roles.inference(laddr2)
    roles.actor("actor-again", laddr2, iaddr2, "zmq")
    assert roles.wait(learner2, "learner", 240) == 0, roles.log("learner")[-3000:]
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["version"] > first_version  # the version counter goes on, never back
    assert resumed["env_steps"] >= 3000 and resumed["env_steps"] > summary["env_steps"]
    # the run spec tells the new life's actors where it resumed: their envs start a new stream
    assert json.loads((run / "run_spec.json").read_text())["resumed_from_env_steps"] == checkpointed > 0
    assert "resumed_from_env_steps" not in yaml.safe_load((run / "config.yaml").read_text())["runner"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_learner_crash_and_resume_the_same_actor_reconnects(roles, tmp_path):
    run, port = tmp_path / "run", _free_port()
    learner, laddr = roles.learner(run, f"learner.port={port}", "runner.total_env_steps=100000000", "eval.at_end=false")
    _, iaddr = roles.inference(laddr)
    actor = roles.actor("actor-steady", laddr, iaddr, "zmq")
    deadline = time.monotonic() + 180
    while _learner_version(laddr) < 4:
        assert time.monotonic() < deadline, roles.log("learner")[-3000:]
        time.sleep(0.2)
    roles.kill_group(learner)  # a crash: no final checkpoint, versions past the last one were published
    learner.wait(10)
    published = int((run / "checkpoints" / "published_version").read_text())
    resumed_from = _checkpointed_env_steps(run)
    learner2, laddr2 = roles.learner(
        run, f"learner.port={port}", "runner.total_env_steps=2000", "eval.at_end=false", resume=True
    )
    assert laddr2 == laddr
    assert roles.wait(learner2, "learner", 240) == 0, roles.log("learner")[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["version"] > published  # never goes back, even past the crash's unsaved versions
    assert summary["segments_by_client"].get("actor-steady", 0) > 0  # the same actor came back
    # nothing counted twice: the checkpoint's env steps plus each segment the new learner took, once.
    # The push in flight at the crash is sent again: accepted once if the first learner never took
    # it, refused as a duplicate if it took it and died before the ack (the actor pushes one at a
    # time, so at most one such segment).
    ingest = summary["ingest"]
    assert summary["env_steps"] == resumed_from + ingest["consumed_env_steps"] and summary["env_steps"] >= 2000
    assert ingest["accepted"] == ingest["consumed"] + ingest["queued"] and ingest["duplicates"] <= 1
    assert roles.wait(actor, "actor-steady", 60) == 0


def _checkpointed_env_steps(run) -> int:
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    return int(json.loads((latest / "trainer_state.json").read_text())["counters"]["env_steps"])
