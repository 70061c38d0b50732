"""The learner's ingest queue hands out the segment with the oldest acting policy first (earliest
lag deadline), arrival order among equals; nothing is lost or counted twice on the way."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from rlfleet.learner.ingest import IngestedSegment, IngestQueue


def _item(client: str, seg_id: int, versions: list[int]) -> IngestedSegment:
    seg = SimpleNamespace(versions=np.array(versions, np.int64), env_steps=np.array(len(versions)))
    return IngestedSegment(client, seg_id, seg)  # type: ignore[arg-type]


def test_a_late_segment_of_an_older_policy_is_trained_before_newer_ones():
    q = IngestQueue(maxsize=8)
    arrivals = [
        _item("fast", 1, [5, 5, 6]),
        _item("fast", 2, [6, 6, 7]),
        _item("slow", 1, [3, 4, 5]),  # stepped while the learner moved on: its first rows are the oldest
        _item("other", 1, [5, 6, 6]),  # the same oldest version as fast/1: after it, in arrival order
    ]
    for item in arrivals:
        assert q.put(item, timeout=1)
    got = [(it.client_id, it.segment_id) for it in iter(lambda: q.get(timeout=0.01), None)]
    assert got == [("slow", 1), ("fast", 1), ("other", 1), ("fast", 2)]
    acct = q.accounting()
    assert (acct["accepted"], acct["consumed"], acct["queued"]) == (4, 4, 0)
    assert acct["accepted_env_steps"] == acct["consumed_env_steps"] == 12


def test_in_order_versions_leave_in_arrival_order():
    q = IngestQueue(maxsize=8)
    for i, v in enumerate([0, 0, 1, 1, 2]):
        q.put(_item("a", i, [v, v]), timeout=1)
    assert [q.get(timeout=0.01).segment_id for _ in range(5)] == [0, 1, 2, 3, 4]
    assert q.get(timeout=0.01) is None
