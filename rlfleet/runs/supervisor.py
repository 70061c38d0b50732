"""Local mode's actor supervisor: a crashed actor process is started again, at a bounded rate.

The bound is a token bucket per actor: `max_restarts` restarts at most in a burst, one more
earned back every `refill_s` seconds (0: never, the bound is then per run). A run of many
hours survives a crash now and then; an actor that crashes in a loop is given up on. The
console names the cause of each death: the last line of the actor's log (its exception).

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
    max_restarts: int = 3  # per actor: the bucket's size (restarts in a burst)
    backoff_s: float = 2.0  # before the first restart; doubled for each further one in a burst
    max_backoff_s: float = 60.0
    refill_s: float = 600.0  # one restart earned back per this many seconds; 0: never (per run)

    def delay(self, restarts_so_far: int) -> float:
        return min(self.backoff_s * 2**restarts_so_far, self.max_backoff_s)


class RestartBudget:
    """A token bucket: `capacity` restarts, refilled at one per `refill_s` seconds."""

    def __init__(self, capacity: int, refill_s: float, now: float):
        self.capacity, self.refill_s = capacity, refill_s
        self.tokens, self._at = float(capacity), now

    def _refill(self, now: float) -> None:
        if self.refill_s > 0:
            self.tokens = min(float(self.capacity), self.tokens + (now - self._at) / self.refill_s)
        self._at = now

    def take(self, now: float) -> bool:
        """Spend one restart if there is one left."""
        self._refill(now)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def used(self, now: float) -> int:
        """Restarts spent and not yet earned back (how deep in a burst we are: the backoff)."""
        self._refill(now)
        return int(self.capacity - self.tokens)


def last_error_line(log_file: Path | None, max_bytes: int = 16384) -> str:
    """The last non-empty line of a log: for a process killed by an exception, the exception."""
    if log_file is None:
        return ""
    try:
        with open(log_file, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.strip():
            return line.strip()[:300]
    return ""


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class ActorSupervisor:
    """Owns the actor processes; call `poll()` regularly while the learner runs."""

    def __init__(
        self,
        spawn: Callable[[int], subprocess.Popen],
        num_actors: int,
        policy: RestartPolicy,
        pid_dir: Path | None = None,
        log_file: Callable[[int], Path] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._spawn, self.policy, self.pid_dir, self._log_file, self._clock = spawn, policy, pid_dir, log_file, clock
        if pid_dir is not None:
            pid_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen] = {}
        self.restarts = {i: 0 for i in range(num_actors)}  # over the run
        self.budgets = {i: RestartBudget(policy.max_restarts, policy.refill_s, clock()) for i in range(num_actors)}
        self.causes: dict[int, str] = {}  # actor index -> what its last death said
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
        now = self._clock()
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
                log.warning(
                    "restarted actor %d as pid %d (restart %d; %.1f of %d left, one back every %gs)",
                    index,
                    self.procs[index].pid,
                    self.restarts[index],
                    self.budgets[index].tokens,
                    self.policy.max_restarts,
                    self.policy.refill_s,
                )

    def _schedule(self, index: int, proc: subprocess.Popen, code: int, now: float) -> None:
        # a signal is its own cause (the log's last line is whatever the process did last); an
        # error exit's last line is its exception or its one-line error
        cause = "" if code < 0 else last_error_line(self._log_file(index) if self._log_file else None)
        self.causes[index] = cause
        said = f": {cause}" if cause else ""
        budget = self.budgets[index]
        used = budget.used(now)
        if not budget.take(now):
            self.given_up.add(index)
            log.error(
                "actor %d (pid %d) died with %s%s; not restarting it: it was restarted %d times, %d in the "
                "last burst (actor.max_restarts, one earned back every actor.restart_refill_s=%gs)",
                index,
                proc.pid,
                describe_exit(code),
                said,
                self.restarts[index],
                self.policy.max_restarts,
                self.policy.refill_s,
            )
            return
        delay = self.policy.delay(used)
        self._due[index] = now + delay
        log.warning(
            "actor %d (pid %d) died with %s%s; restarting actor %d in %.1fs",
            index,
            proc.pid,
            describe_exit(code),
            said,
            index,
            delay,
        )

    def current(self) -> list[subprocess.Popen]:
        return list(self.procs.values())
