"""Local mode's actor supervisor: a crashed actor process is started again, a bounded number of times.

Only a failure is restarted (a non-zero exit code or a signal); an actor that exits 0 was told
by the learner that training is over. The new process gets the same actor index, hence the same
env tasks, and starts fresh episodes; the learner counts nothing twice, because segment ids are
unique per process (`rlfleet.actors.learner_client`) and only complete, acknowledged segments
are queued. What the dead process had not pushed yet (at most its unfinished segments and its
send queue) is lost, not duplicated. Each actor's current pid is written to `pid_dir/actorI.pid`.
"""
from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class RestartPolicy:
    max_restarts: int = 3  # per actor, over the whole run
    backoff_s: float = 2.0  # before the first restart; doubled for each further one
    max_backoff_s: float = 60.0

    def delay(self, restarts_so_far: int) -> float:
        return min(self.backoff_s * 2 ** restarts_so_far, self.max_backoff_s)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class ActorSupervisor:
    """Owns the actor processes; call `poll()` regularly while the learner runs."""

    def __init__(self, spawn: Callable[[int], subprocess.Popen], num_actors: int, policy: RestartPolicy,
                 pid_dir: Path | None = None):
        self._spawn, self.policy, self.pid_dir = spawn, policy, pid_dir
        if pid_dir is not None:
            pid_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen] = {}
        self.restarts = {i: 0 for i in range(num_actors)}
        self.given_up: set[int] = set()
        self._due: dict[int, float] = {}  # actor index -> when to restart it
        for i in range(num_actors):
            self._start(i)

    def _start(self, index: int) -> None:
        proc = self.procs[index] = self._spawn(index)
        if self.pid_dir is not None:
            tmp = self.pid_dir / f"actor{index}.pid.tmp"
            tmp.write_text(str(proc.pid))
            tmp.replace(self.pid_dir / f"actor{index}.pid")

    def poll(self) -> None:
        """Schedule a restart for each actor that died with an error; start those whose backoff is over."""
        now = time.monotonic()
        for index, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or code == 0 or index in self.given_up:
                continue
            if index not in self._due:
                self._schedule(index, proc, code, now)
            elif now >= self._due[index]:
                del self._due[index]
                self.restarts[index] += 1
                self._start(index)
                log.warning("restarted actor %d as pid %d (restart %d of %d)", index, self.procs[index].pid,
                            self.restarts[index], self.policy.max_restarts)

    def _schedule(self, index: int, proc: subprocess.Popen, code: int, now: float) -> None:
        if self.restarts[index] >= self.policy.max_restarts:
            self.given_up.add(index)
            log.error("actor %d (pid %d) died with %s; not restarting it: it already was %d times "
                      "(actor.max_restarts)", index, proc.pid, describe_exit(code), self.restarts[index])
            return
        delay = self.policy.delay(self.restarts[index])
        self._due[index] = now + delay
        log.warning("actor %d (pid %d) died with %s; restarting actor %d in %.1fs", index, proc.pid,
                    describe_exit(code), index, delay)

    def current(self) -> list[subprocess.Popen]:
        return list(self.procs.values())
