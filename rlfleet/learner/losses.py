"""Env steps that were taken but never trained on, counted by cause across crashes and resumes.

The account is kept in `RUN/checkpoints/env_step_ledger.json` (a snapshot, written atomically)
and `env_step_ledger.log` beside it (one JSON line appended per change, so it survives a SIGKILL
of the learner and costs the same whatever the account's size; every COMPACT_EVERY lines the
snapshot is rewritten and the log emptied). `read_ledger` gives the current state:

* `accepted`: env steps in segments any learner life of this run accepted;
* `consumed`: the run's counted env steps (`summary.env_steps`) as of the last change;
* `lost`: env steps lost, by cause (below); `lives`: actor lives whose report was counted;
* `segments`: per actor life (`CLIENT/LIFE`, LIFE = segment_id >> 32), the newest segment id
  accepted and the env steps accepted. An actor pushes its segments one at a time, in id order,
  so a resumed learner refuses as a duplicate any id at or below the newest one (a segment whose
  acknowledgement the crash cut off, sent again); and a killed life's losses are taken from what
  learners accepted, not from its ledger file, which may have missed the last acknowledgement.

Causes:

* `actor_crashed` / `actor_stopped`: taken by an actor process but in no segment a learner
  accepted or rejected (its unfinished segments and its send queue), from the life's own report
  (`LifeReport`; a crashed life's successor sends it from the life's ledger file);
* `rejected_segments`: in segments a learner refused;
* `resume_rollback`: counted by a learner after its last checkpoint, then lost when it stopped
  or crashed: `--resume` goes back to the checkpoint's count;
* `learner_queue`: accepted but still queued (or in flight to the trainer) when a learner
  crashed or stopped, counted at the next resume; at the end of the run the queue left over is
  `unconsumed_at_end`.

So over a run: env steps taken by actors = counted + the sum of `lost` (+ the queue at the end),
nothing counted twice. The learner's summary has the account under `lost_env_steps`.

A life report is checked against what the learners saw from that life: no count is negative,
`accepted` is at most what learners accepted from it, `rejected` at most its refused pushes times
the largest segment, and `taken` at most accepted + rejected + `life_slack` (what one life can
hold unsent: its send queue and unfinished segments). A report outside that is refused and
counted (`BadLifeReport`), never added. The account stays bounded: at most MAX_LIVES_PER_CLIENT
reported lives per client id and MAX_LIVES in all are remembered (older ones are already in the
totals: only their repeat detection is forgotten), and the pushes of at most MAX_PUSHING_LIVES
lives (the least recently pushing go first).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
LEDGER_FILE = "env_step_ledger.json"
LOG_FILE = "env_step_ledger.log"
COMPACT_EVERY = 4096  # log lines between snapshots: the log's size and a resume's replay stay bounded
MAX_LIVES_PER_CLIENT = 64  # reported lives remembered per client id (for repeat detection)
MAX_LIVES = 8192  # reported lives remembered in all
MAX_PUSHING_LIVES = 8192  # lives whose pushes are remembered, least recently pushing dropped first
MAX_LIFE = (1 << 31) - 1  # a life is the upper half of a segment id, drawn from 31 random bits


class BadLifeReport(ValueError):
    """A life report that cannot be true for what the learners saw: refused, never added."""


class LossLedger:
    def __init__(self, folder: Path, life_slack: int = 1 << 20, segment_env_steps: int = 1 << 20):
        self.path = Path(folder) / LEDGER_FILE
        self.log_path = Path(folder) / LOG_FILE
        self.life_slack = life_slack  # env steps one life can take beyond its pushes (queue + unfinished)
        self.segment_env_steps = segment_env_steps  # the most env steps one push can carry
        self.accepted = 0
        self.consumed = 0
        self.lost: Counter[str] = Counter()
        self.lives: OrderedDict[str, None] = OrderedDict()  # reported, oldest first
        self._lives_of: dict[str, list[str]] = {}  # client id -> its remembered reported lives
        self.folded_lives = 0  # reported lives forgotten by the caps (their losses stay in `lost`)
        # "client/life" -> [newest segment id, env steps accepted, pushes refused], least recent first
        self.segments: OrderedDict[str, list[int]] = OrderedDict()
        self.refused_reports = 0
        self._seq = 0
        self._since_snapshot = 0
        self._fd: int | None = None
        self._lock = threading.Lock()

    # ---- state changes: each applied in memory and appended to the log -------------------------
    def _apply(self, event: dict[str, Any]) -> None:  # caller holds the lock (or is loading)
        if "a" in event:
            client, segment_id, steps = event["a"]
            self.accepted += steps
            entry = self._open_entry(f"{client}/{segment_id >> 32:x}")
            entry[0] = max(entry[0], segment_id)
            entry[1] += steps
        elif "r" in event:
            self._open_entry(event["r"])[2] += 1
        elif "c" in event:
            self.consumed = event["c"]
        elif "l" in event:
            key, cause, lost, rejected = event["l"]
            self.lost[cause] += lost
            self.lost["rejected_segments"] += rejected
            self._remember_life(key)

    def _open_entry(self, key: str) -> list[int]:
        entry = self.segments.get(key)
        if entry is None:
            entry = self.segments[key] = [0, 0, 0]
            while len(self.segments) > MAX_PUSHING_LIVES:
                self.segments.popitem(last=False)
        else:
            self.segments.move_to_end(key)
        return entry

    def _remember_life(self, key: str) -> None:
        self.lives[key] = None
        mine = self._lives_of.setdefault(key.rpartition("/")[0], [])
        mine.append(key)
        if len(mine) > MAX_LIVES_PER_CLIENT:
            self.lives.pop(mine.pop(0), None)
            self.folded_lives += 1
        while len(self.lives) > MAX_LIVES:
            old, _ = self.lives.popitem(last=False)
            others = self._lives_of.get(old.rpartition("/")[0])
            if others is not None and old in others:
                others.remove(old)
                if not others:
                    del self._lives_of[old.rpartition("/")[0]]
            self.folded_lives += 1

    def _record(self, event: dict[str, Any]) -> None:  # caller holds the lock
        self._apply(event)
        self._seq += 1
        event["s"] = self._seq
        if self._fd is None or self._since_snapshot >= COMPACT_EVERY:
            self._snapshot()
            return
        os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())
        self._since_snapshot += 1

    # ---- the run's life cycle ---------------------------------------------------------------
    def resume(self, checkpoint_env_steps: int) -> None:
        """After `--resume`: what the previous learner life counted or queued past its checkpoint is lost."""
        if not self.path.exists():
            log.warning("no %s beside the checkpoint: losses before this resume are not known", self.path.name)
            with self._lock:
                self.consumed = self.accepted = checkpoint_env_steps
                self._snapshot()
            return
        with self._lock:
            self._load()
            learner_lost = self.lost["resume_rollback"] + self.lost["learner_queue"]
            rollback = max(0, self.consumed - checkpoint_env_steps)
            queued = max(0, self.accepted - self.consumed - learner_lost)
            self.lost["resume_rollback"] += rollback
            self.lost["learner_queue"] += queued
            self.consumed = checkpoint_env_steps
            self._snapshot()
        if rollback or queued:
            log.warning(
                "resume: %d env steps counted after the checkpoint and %d queued are lost "
                "(lost_env_steps: resume_rollback, learner_queue)",
                rollback,
                queued,
            )

    def start(self, env_steps: int = 0) -> None:
        """A fresh run."""
        with self._lock:
            self.consumed = self.accepted = env_steps
            self._snapshot()

    def accepted_segment(self, client_id: str, segment_id: int, env_steps: int) -> None:
        with self._lock:
            self._record({"a": [client_id, int(segment_id), int(env_steps)]})

    def refused_push(self, client_id: str, segment_id: int) -> None:
        """A push a learner refused: its life may report up to one segment's env steps as rejected."""
        with self._lock:
            self._record({"r": f"{client_id}/{int(segment_id) >> 32:x}"})

    def seen_before(self, client_id: str, segment_id: int) -> bool:
        """A segment a learner of this run already accepted (ids of one actor life only grow)."""
        with self._lock:
            entry = self.segments.get(f"{client_id}/{segment_id >> 32:x}")
            return entry is not None and segment_id <= entry[0]

    def counted(self, env_steps_total: int) -> None:
        with self._lock:
            self._record({"c": int(env_steps_total)})

    def life_ended(self, client_id: str, life: int, taken: int, accepted: int, rejected: int, crashed: bool) -> int:
        """An actor life's final account; returns the env steps it lost (0 for a repeated report).

        Raises BadLifeReport (nothing is added) for an account the learners' own count rules out.
        """
        key = f"{client_id}/{life:x}"
        with self._lock:
            if key in self.lives:
                return 0
            _, seen, refused = self.segments.get(key) or (0, 0, 0)
            problem = None
            if not 0 < life <= MAX_LIFE:
                problem = f"life {life} is outside 1..{MAX_LIFE}"
            elif min(taken, accepted, rejected) < 0:
                problem = "a negative count"
            elif accepted > seen:
                problem = f"{accepted} env steps accepted, learners accepted {seen} from this life"
            elif rejected > refused * self.segment_env_steps:
                problem = f"{rejected} env steps rejected in {refused} refused pushes"
            elif taken > seen + rejected + self.life_slack:
                problem = (
                    f"{taken} env steps taken, more than {seen} accepted + {rejected} rejected + {self.life_slack}"
                )
            if problem is not None:
                self.refused_reports += 1
                raise BadLifeReport(f"life report of {key[:200]} refused: {problem}")
            # the learners' count: a killed life's ledger file may miss a last acknowledgement
            lost = max(0, taken - seen - rejected)
            self._record({"l": [key, "actor_crashed" if crashed else "actor_stopped", lost, rejected]})
        return lost

    def by_cause(self, queued_env_steps: int = 0) -> dict[str, int]:
        with self._lock:
            out = {k: v for k, v in sorted(self.lost.items()) if v}
        if queued_env_steps:
            out["unconsumed_at_end"] = queued_env_steps
        return out

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # ---- files ------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {
            "seq": self._seq,
            "accepted": self.accepted,
            "consumed": self.consumed,
            "lost": dict(self.lost),
            "lives": list(self.lives),
            "folded_lives": self.folded_lives,
            "segments": dict(self.segments),
        }

    def _load(self) -> None:  # caller holds the lock
        state = json.loads(self.path.read_text())
        self._seq = int(state.get("seq", 0))
        self.accepted, self.consumed = int(state["accepted"]), int(state["consumed"])
        self.lost = Counter({k: int(v) for k, v in state["lost"].items()})
        self.lives, self._lives_of, self.folded_lives = OrderedDict(), {}, int(state.get("folded_lives", 0))
        for key in state.get("lives", []):
            self._remember_life(key)
        self.segments = OrderedDict(
            (k, [int(x) for x in (list(v) + [0])[:3]]) for k, v in state.get("segments", {}).items()
        )
        for event in _log_events(self.log_path):
            if event.get("s", 0) > self._seq:  # older lines are already in the snapshot
                self._apply(event)
                self._seq = event["s"]

    def _snapshot(self) -> None:  # caller holds the lock
        """Write the whole state atomically, then start an empty log (replay skips what the
        snapshot holds by sequence number, so a crash between the two counts nothing twice)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self._state()))
        os.replace(tmp, self.path)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self._since_snapshot = 0


def _log_events(path: Path) -> list[dict[str, Any]]:
    """The log's complete lines (a line cut off by a crash is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n"):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("s"), int):
            out.append(event)
    return out


def read_ledger(folder: Path) -> dict[str, Any]:
    """The account as it stands on disk (snapshot plus log), e.g. after a learner was killed."""
    led = LossLedger(folder)
    led._load()
    return led._state()
