"""Credit-based flow control: actors start a segment only when the learner could train it within
`algorithm.max_policy_lag` (`learner.flow_control: pace`).

Without it a fleet that samples faster than the learner trains fills every buffer on the way (the
actor's segments in progress, its send queue, the push in flight, the ingest queue); the rows wait
there for updates and the trainer masks those older than the lag bound: stepped, then thrown away.

The learner keeps one number, the samples it owes training: `untrained` (accepted, not yet in a
finished update: the ingest queue, the batch being gathered, the columns carried to the next
update) plus `reserved` (granted to an actor for a segment it is stepping or sending). The learner
trains its queue oldest acting policy first (rlfleet.learner.ingest; arrival order when versions
arrive in order), exactly `batch_samples` (b) samples per update, so a segment granted at
learner version V has at most `owed` samples ahead of it (when segments arrive in the order they
were granted: actors that step a segment faster than the learner trains an update, the case
pacing is for; one that arrives late goes ahead of newer ones): its last row is trained at
version V + (owed + segment - 1) // b. An actor asks
before each segment (`Credits` RPC); the answer waits until

    owed < b                                       (the next update cannot start without it), or
    owed + segment <= max(max_policy_lag, 1) * b   (trained by V + max_policy_lag - 1), or
    owed + segment <= (max_policy_lag + 1) * b  and  V + (owed + segment - 1) // b - v <= max_policy_lag

and reserves the segment until it arrives. The second rule leaves one update of room for weights
still on their way to the actor's inference server (its next actions may come from V - 1); the
third gives that room to the learner when the actor's latest actions, of version v (its request
tells it; the next ones are at least as new), show its weights are current, so a small lag bound
still keeps the next batch ready while the learner trains. A client's reservations end when its
credit stream does (the actor stopped or died): its segments still queued to send arrive
unreserved. A segment the learner rejects gives its reservation back (`unreserve`), or the
rejections would keep `owed` high until nothing is granted again. One client holds at most
`max_held` samples reserved (the service sets it from the run's segment size): a further request
waits like one with no room, so a stranger cannot reserve the whole budget.
"""

from __future__ import annotations

import threading
import time


def pace_limit(batch_samples: int, max_policy_lag: int) -> int:
    """Samples the learner may owe training while it grants more to an actor whose weights are
    current (module docstring)."""
    return (max_policy_lag + 1) * batch_samples


class SampleCredits:
    """The learner's side of the credit protocol; thread-safe (gRPC handlers and the train loop)."""

    def __init__(self, batch_samples: int, max_policy_lag: int, max_held: int = 0):
        """`max_held`: samples one client may hold reserved at once (0: no bound)."""
        if batch_samples <= 0 or max_policy_lag < 0 or max_held < 0:
            raise ValueError(
                f"need batch_samples > 0, max_policy_lag >= 0 and max_held >= 0, got"
                f" {batch_samples}, {max_policy_lag}, {max_held}"
            )
        self.max_held = max_held
        self.batch, self.max_lag = batch_samples, max_policy_lag
        self.limit = pace_limit(batch_samples, max_policy_lag)
        self.blind_limit = max(max_policy_lag, 1) * batch_samples  # whatever the actor's version
        self.version = 0  # the learner's: the version the next update trains with
        self.untrained = 0  # accepted samples not yet in a finished update
        self._reserved: dict[str, int] = {}  # granted, not yet arrived, per client
        self._cond = threading.Condition()
        self._stopped = False
        self.waits = 0  # requests that found no room at first: how often the fleet was paced

    def owed(self) -> int:
        with self._cond:
            return self._owed()

    def _owed(self) -> int:  # hold _cond
        return self.untrained + sum(self._reserved.values())

    def held(self, client_id: str) -> int:
        """Samples reserved for the client and not yet arrived."""
        with self._cond:
            return self._reserved.get(client_id, 0)

    def _room(self, client_id: str, samples: int, version: int) -> bool:  # hold _cond
        if self.max_held and self._reserved.get(client_id, 0) + samples > self.max_held:
            return False  # the client's own reservations must arrive first
        owed = self._owed()
        if owed < self.batch:
            return True
        if owed + samples <= self.blind_limit:
            return True
        trained_at = self.version + (owed + samples - 1) // self.batch
        return version >= 0 and owed + samples <= self.limit and trained_at - version <= self.max_lag

    def grant(self, client_id: str, samples: int, timeout: float, again: bool = False, version: int = -1) -> bool:
        """Reserve `samples` for the client's next segment, acted from `version` or newer (-1: not
        known), once there is room; False when there was none for `timeout` seconds (the caller
        asks `again`, or gives up when stopping); False at once after `stop()`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if not again and not self._room(client_id, samples, version):
                self.waits += 1
            while not self._room(client_id, samples, version):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped:
                    return False
                self._cond.wait(remaining)
            if self._stopped:
                return False
            self._reserved[client_id] = self._reserved.get(client_id, 0) + samples
            return True

    def arrived(self, client_id: str, samples: int) -> None:
        """A segment was accepted into the ingest queue: owed to training now, no longer reserved."""
        with self._cond:
            self.untrained += samples
            self._take(client_id, samples)

    def unreserve(self, client_id: str, samples: int) -> None:
        """A segment of the client was rejected: it will not arrive, its reservation ends."""
        with self._cond:
            if self._take(client_id, samples):
                self._cond.notify_all()

    def _take(self, client_id: str, samples: int) -> int:  # hold _cond
        """End up to `samples` of the client's reservation; how many it held of them."""
        held = self._reserved.get(client_id, 0)
        taken = min(held, max(samples, 0))
        if held - taken:
            self._reserved[client_id] = held - taken
        elif held:
            del self._reserved[client_id]
        return taken

    def trained(self, samples: int, version: int | None = None) -> None:
        """An update finished on `samples` samples (or dropped them), and the next one trains with
        `version`: room for more."""
        with self._cond:
            self.untrained = max(0, self.untrained - samples)
            if version is not None:
                self.version = version
            self._cond.notify_all()

    def release(self, client_id: str) -> None:
        """The client's credit stream ended: segments it has not sent will not come."""
        with self._cond:
            if self._reserved.pop(client_id, 0):
                self._cond.notify_all()

    def stop(self) -> None:
        """The learner is stopping: waiting grants return False now, and every later one at once."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
