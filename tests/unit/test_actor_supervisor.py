"""The actor restart budget refills over time, and the console says why an actor died."""

from __future__ import annotations

import logging
from pathlib import Path

from rlfleet.runs.supervisor import (
    ActorSupervisor,
    RestartBudget,
    RestartPolicy,
    last_error_line,
)


class FakeProc:
    """A stand-in for subprocess.Popen: dies when told to."""

    pids = 100

    def __init__(self):
        FakeProc.pids += 1
        self.pid, self.code = FakeProc.pids, None

    def poll(self):
        return self.code


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _crash_and_restart(sup: ActorSupervisor, clock: Clock, index: int = 0) -> bool:
    """Kill actor `index`; True when the supervisor starts it again (after its backoff)."""
    sup.procs[index].code = 1
    sup.poll()
    if index in sup.given_up:
        return False
    clock.t += 120.0  # past any backoff
    before = sup.procs[index]
    sup.poll()
    return sup.procs[index] is not before


def test_budget_is_a_token_bucket():
    b = RestartBudget(3, 100.0, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not b.take(50.0) and b.take(100.0)  # one earned back per 100 s
    assert [b.take(1000.0) for _ in range(4)] == [True, True, True, False]  # capped at 3, not 9
    never = RestartBudget(1, 0.0, now=0.0)
    assert never.take(0.0) and not never.take(1e9)  # refill 0: the old per-run bound


def test_restarts_refill_over_a_long_run(tmp_path):
    """Four crashes far apart no longer end the run (they did with 3 restarts per run)."""
    clock = Clock()
    sup = ActorSupervisor(
        lambda i: FakeProc(), 1, RestartPolicy(max_restarts=3, backoff_s=1.0, refill_s=600.0), clock=clock
    )
    for _ in range(6):
        assert _crash_and_restart(sup, clock)
        clock.t += 3600.0  # an hour of good running between crashes
    assert sup.restarts[0] == 6 and not sup.given_up
    for _ in range(3):  # a crash loop still stops
        assert _crash_and_restart(sup, clock)
    assert not _crash_and_restart(sup, clock) and sup.given_up == {0}


def test_the_console_says_why_an_actor_died(tmp_path, caplog):
    log_file = tmp_path / "actor0.log"
    log_file.write_text(
        "INFO starting\nTraceback (most recent call last):\n  File x\n"
        "rlfleet.envs.remote.RemoteEnvError: env server 127.0.0.1:5 sent a bad observation\n\n"
    )
    clock = Clock()
    sup = ActorSupervisor(
        lambda i: FakeProc(),
        1,
        RestartPolicy(max_restarts=1, refill_s=0.0),
        log_file=lambda i: tmp_path / f"actor{i}.log",
        clock=clock,
    )
    with caplog.at_level(logging.WARNING, logger="rlfleet.runs.supervisor"):
        assert _crash_and_restart(sup, clock)
        assert not _crash_and_restart(sup, clock)
    died = [r.getMessage() for r in caplog.records if "died with exit code 1" in r.getMessage()]
    assert len(died) == 2 and all(
        m.endswith("sent a bad observation; restarting actor 0 in 2.0s")
        or "sent a bad observation; not restarting it" in m
        for m in died
    )
    assert sup.causes[0].startswith("rlfleet.envs.remote.RemoteEnvError")
    assert last_error_line(Path(tmp_path / "missing.log")) == "" and last_error_line(None) == ""
