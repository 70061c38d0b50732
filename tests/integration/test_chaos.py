"""Chaos: every role SIGKILLed in turn mid-run and started again (actor over shm, actor over zmq,
env server, inference server, learner), then the account: env steps the actors took == env steps
counted + env steps lost by cause, nothing counted twice, and the policy version never goes back."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import grpc
import pytest

from rlfleet.learner.losses import read_ledger
from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc

pytestmark = pytest.mark.slow  # 80-250 s on the shared 2-core development machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VersionWatch:
    """Polls the learner's policy version (a heartbeat of its own) and records every answer."""

    def __init__(self, address: str):
        self.address, self.seen, self._stop = address, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with grpc.insecure_channel(self.address) as ch:
                    reply = learner_pb2_grpc.LearnerServiceStub(ch).Heartbeat(
                        learner_pb2.HeartbeatRequest(client_id="chaos-watch"), timeout=2
                    )
                if reply.policy_version >= 0:
                    self.seen.append(reply.policy_version)
            except grpc.RpcError:
                pass  # the learner is down right now
            self._stop.wait(0.2)

    def wait_for(self, version: int, timeout: float, why) -> None:
        deadline = time.monotonic() + timeout
        while not self.seen or self.seen[-1] < version:
            assert time.monotonic() < deadline, why()
            time.sleep(0.2)

    def latest(self) -> int:
        return self.seen[-1] if self.seen else -1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def test_every_role_killed_and_restarted_loses_nothing_uncounted(roles, tmp_path, monkeypatch):
    ledgers = tmp_path / "ledgers"
    monkeypatch.setenv("RLFLEET_ACTOR_LEDGER_DIR", str(ledgers))  # inherited by the actor processes
    run, lport, gport, zport, eport = tmp_path / "run", _free_port(), _free_port(), _free_port(), _free_port()
    env_name = f"remote://127.0.0.1:{eport}?connect_timeout=120&timeout=60&reconnect_timeout=180"

    def env_server():
        return roles.env_server(eport)

    def inference(laddr: str):
        (tmp_path / "inference.json").unlink(missing_ok=True)
        proc = roles.start(
            "inference",
            "inference",
            "--learner",
            laddr,
            "--grpc-port",
            str(gport),
            "--zmq-port",
            str(zport),
            "--address-file",
            str(tmp_path / "inference.json"),
        )
        return proc, roles.wait_address("inference", proc)["inference"]

    common = [
        f"learner.port={lport}",
        f"env.name={env_name}",
        "eval.at_end=false",
        "actor.send_queue_size=4",
        "actor.failover.request_timeout_s=20",
    ]
    envsrv = env_server()
    learner, laddr = roles.learner(run, *common, "runner.total_env_steps=100000000")
    infer, iaddr = inference(laddr)
    shm = roles.actor("chaos-shm", laddr, iaddr, "shm")
    zmq = roles.actor("chaos-zmq", laddr, iaddr, "zmq")
    watch = VersionWatch(laddr)

    def logs() -> str:
        return "\n".join(roles.log(n)[-1500:] for n in ("learner", "inference", "chaos-shm", "chaos-zmq", "env"))

    def stepping(client: str, timeout: float = 240) -> None:
        """Until a new life of `client` (a ledger never seen before) has taken env steps."""
        deadline = time.monotonic() + timeout
        while True:
            new = [p for p in ledgers.glob(f"{client}.*.ledger") if p.stem not in known]
            if any(struct.unpack("<qqq", p.read_bytes()[:24])[0] > 0 for p in new):
                known.update(p.stem for p in new)
                return
            assert time.monotonic() < deadline, logs()
            time.sleep(0.2)

    known: set[str] = set()

    try:
        watch.wait_for(3, 240, logs)
        stepping("chaos-shm")

        roles.kill_group(shm)  # 1. an actor, mid-segment: the next life reports its losses
        shm.wait(10)
        shm = roles.actor("chaos-shm", laddr, iaddr, "shm")
        stepping("chaos-shm")
        watch.wait_for(watch.latest() + 3, 240, logs)

        roles.kill_group(envsrv)  # 2. the simulator: the env clients reopen their sessions
        envsrv.wait(10)
        envsrv = env_server()
        watch.wait_for(watch.latest() + 3, 300, logs)
        assert "reopening the session" in roles.log("chaos-zmq") + roles.log("chaos-shm")

        roles.kill_group(infer)  # 3. the inference server: zmq waits for it, shm's actor stops
        infer.wait(10)
        infer, iaddr = inference(laddr)
        assert roles.wait(shm, "chaos-shm", 180) != 0  # shm has no failover: a lost server is an error
        shm = roles.actor("chaos-shm", laddr, iaddr, "shm")
        watch.wait_for(watch.latest() + 3, 300, logs)

        roles.kill_group(learner)  # 4. the learner: resumed on the same port, actors push again
        learner.wait(10)
        before = watch.latest()
        published = int((run / "checkpoints" / "published_version").read_text())
        env_steps_at_crash = read_ledger(run / "checkpoints")["consumed"]
        learner, laddr2 = roles.learner(run, *common, f"runner.total_env_steps={env_steps_at_crash + 600}", resume=True)
        assert laddr2 == laddr
        assert roles.wait(learner, "learner", 400) == 0, logs()
        for name, proc in (("chaos-shm", shm), ("chaos-zmq", zmq)):
            assert roles.wait(proc, name, 90) == 0, roles.log(name)[-3000:]  # told to stop: a clean exit
    finally:
        watch.close()

    summary = json.loads((run / "summary.json").read_text())
    # the version never went back, not even past the crash's unsaved versions
    assert watch.seen == sorted(watch.seen), watch.seen
    assert summary["version"] > max(published, before)
    # every env step any actor life took is counted once or lost by a named cause
    taken = {p.name: struct.unpack("<qqq", p.read_bytes()[:24])[0] for p in ledgers.iterdir()}
    assert all(p.endswith(".reported") for p in taken), taken  # every life's account reached the learner
    lost = summary["lost_env_steps"]
    assert sum(taken.values()) == summary["env_steps"] + sum(lost.values()), (taken, summary)
    assert lost.get("actor_crashed", 0) > 0 and lost.get("actor_stopped", 0) > 0, lost
    assert len(taken) >= 4  # chaos-shm: 2-3 lives, chaos-zmq: 1
    assert summary["rejected_segments"] == 0, summary["rejected_by_reason"]
