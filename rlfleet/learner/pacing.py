"""Credit-based flow control: actors start a segment only when the learner could train it within
`algorithm.max_policy_lag` (`learner.flow_control: pace`).

Without it a fleet that samples faster than the learner trains fills every buffer on the way (the
actor's segments in progress, its send queue, the push in flight, the ingest queue); the rows wait
there for updates and the trainer masks those older than the lag bound: stepped, then thrown away.

The learner keeps one number, the samples it owes training: `untrained` (accepted, not yet in a
finished update: the ingest queue, the batch being gathered, the columns carried to the next
update) plus `reserved` (granted to an actor for a segment it is stepping or sending). An actor
asks before each segment (`Credits` RPC); the answer waits until

    owed + segment <= limit    or    owed < batch_samples (the next update cannot start without it)

and reserves the segment until it arrives. The learner trains its queue in order, exactly
`batch_samples` samples per update, so a segment granted at version V has at most `owed` samples
ahead of it: its last row is in update V + (owed + segment - 1) // batch_samples. With
`limit = max(max_policy_lag, 1) * batch_samples` that is V + max_policy_lag - 1 at most, one
update of room left for the weights to reach the inference servers (the segment's first actions
may come from the version before V). A client's reservations end when its credit stream does
(the actor stopped or died): its segments still queued to send arrive unreserved.
"""

from __future__ import annotations

import threading
import time


def pace_limit(batch_samples: int, max_policy_lag: int) -> int:
    """Samples the learner may owe training while it grants more (module docstring)."""
    return max(max_policy_lag, 1) * batch_samples


class SampleCredits:
    """The learner's side of the credit protocol; thread-safe (gRPC handlers and the train loop)."""

    def __init__(self, limit_samples: int, batch_samples: int):
        if batch_samples <= 0:
            raise ValueError(f"batch_samples must be positive, got {batch_samples}")
        self.limit = limit_samples
        self.batch = batch_samples
        self.untrained = 0  # accepted samples not yet in a finished update
        self._reserved: dict[str, int] = {}  # granted, not yet arrived, per client
        self._cond = threading.Condition()
        self.grants = 0  # credits given
        self.waits = 0  # requests that found no room at first: how often the fleet was paced

    def owed(self) -> int:
        with self._cond:
            return self._owed()

    def _owed(self) -> int:  # hold _cond
        return self.untrained + sum(self._reserved.values())

    def _room(self, samples: int) -> bool:  # hold _cond
        owed = self._owed()
        return owed < self.batch or owed + samples <= self.limit

    def grant(self, client_id: str, samples: int, timeout: float, again: bool = False) -> bool:
        """Reserve `samples` for the client's next segment once there is room; False when there was
        none for `timeout` seconds (the caller asks `again`, or gives up when stopping)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if not again and not self._room(samples):
                self.waits += 1
            while not self._room(samples):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._reserved[client_id] = self._reserved.get(client_id, 0) + samples
            self.grants += 1
            return True

    def arrived(self, client_id: str, samples: int) -> None:
        """A segment was accepted into the ingest queue: owed to training now, no longer reserved."""
        with self._cond:
            self.untrained += samples
            held = self._reserved.get(client_id, 0)
            if held:
                left = held - min(held, samples)
                if left:
                    self._reserved[client_id] = left
                else:
                    del self._reserved[client_id]

    def trained(self, samples: int) -> None:
        """An update finished on `samples` samples (or dropped them): room for more."""
        with self._cond:
            self.untrained = max(0, self.untrained - samples)
            self._cond.notify_all()

    def release(self, client_id: str) -> None:
        """The client's credit stream ended: segments it has not sent will not come."""
        with self._cond:
            if self._reserved.pop(client_id, 0):
                self._cond.notify_all()

    def wake(self) -> None:
        """Wake waiting grants (stopping)."""
        with self._cond:
            self._cond.notify_all()
