"""Env steps that were taken but never trained on, counted by cause across crashes and resumes.

The account, kept in `RUN/checkpoints/env_step_ledger.json` (rewritten atomically as it
changes, so it survives a SIGKILL of the learner):

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
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from pathlib import Path

log = logging.getLogger(__name__)
LEDGER_FILE = "env_step_ledger.json"


class LossLedger:
    def __init__(self, folder: Path):
        self.path = Path(folder) / LEDGER_FILE
        self.accepted = 0
        self.consumed = 0
        self.lost: Counter[str] = Counter()
        self.lives: set[str] = set()
        self.segments: dict[str, list[int]] = {}  # "client/life" -> [newest segment id, env steps accepted]
        self._lock = threading.Lock()

    def resume(self, checkpoint_env_steps: int) -> None:
        """After `--resume`: what the previous learner life counted or queued past its checkpoint is lost."""
        if not self.path.exists():
            log.warning("no %s beside the checkpoint: losses before this resume are not known", self.path.name)
            with self._lock:
                self.consumed = self.accepted = checkpoint_env_steps
                self._save()
            return
        state = json.loads(self.path.read_text())
        with self._lock:
            self.accepted, self.consumed = int(state["accepted"]), int(state["consumed"])
            self.lost = Counter({k: int(v) for k, v in state["lost"].items()})
            self.lives = set(state.get("lives", []))
            self.segments = {k: [int(a), int(b)] for k, (a, b) in state.get("segments", {}).items()}
            learner_lost = self.lost["resume_rollback"] + self.lost["learner_queue"]
            rollback = max(0, self.consumed - checkpoint_env_steps)
            queued = max(0, self.accepted - self.consumed - learner_lost)
            self.lost["resume_rollback"] += rollback
            self.lost["learner_queue"] += queued
            self.consumed = checkpoint_env_steps
            self._save()
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
            self._save()

    def accepted_segment(self, client_id: str, segment_id: int, env_steps: int) -> None:
        with self._lock:
            self.accepted += env_steps
            entry = self.segments.setdefault(f"{client_id}/{segment_id >> 32:x}", [0, 0])
            entry[0] = max(entry[0], segment_id)
            entry[1] += env_steps
            self._save()

    def seen_before(self, client_id: str, segment_id: int) -> bool:
        """A segment a learner of this run already accepted (ids of one actor life only grow)."""
        with self._lock:
            entry = self.segments.get(f"{client_id}/{segment_id >> 32:x}")
            return entry is not None and segment_id <= entry[0]

    def counted(self, env_steps_total: int) -> None:
        with self._lock:
            self.consumed = env_steps_total
            self._save()

    def life_ended(self, client_id: str, life: int, taken: int, accepted: int, rejected: int, crashed: bool) -> int:
        """An actor life's final account; returns the env steps it lost (0 for a repeated report)."""
        key = f"{client_id}/{life:x}"
        with self._lock:
            if key in self.lives:
                return 0
            if crashed and key in self.segments:  # the learners' count: the ledger may miss a last ack
                accepted = self.segments[key][1]
            lost = max(0, taken - accepted - rejected)
            self.lives.add(key)
            self.lost["actor_crashed" if crashed else "actor_stopped"] += lost
            self.lost["rejected_segments"] += max(0, rejected)
            self._save()
        return lost

    def by_cause(self, queued_env_steps: int = 0) -> dict[str, int]:
        with self._lock:
            out = {k: v for k, v in sorted(self.lost.items()) if v}
        if queued_env_steps:
            out["unconsumed_at_end"] = queued_env_steps
        return out

    def _save(self) -> None:  # caller holds the lock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "accepted": self.accepted,
                    "consumed": self.consumed,
                    "lost": dict(self.lost),
                    "lives": sorted(self.lives),
                    "segments": self.segments,
                }
            )
        )
        os.replace(tmp, self.path)
