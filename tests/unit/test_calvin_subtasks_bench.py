"""bench/calvin_subtasks.py's tally: which subtask a chain was attempting when it stopped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "calvin_subtasks", Path(__file__).resolve().parents[2] / "bench" / "calvin_subtasks.py"
)
calvin_subtasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calvin_subtasks)


def test_a_chain_attempts_its_subtasks_up_to_the_first_failure():
    chains = [("a", "b", "c"), ("b", "a", "c"), ("a", "c", "b"), ("c", "a", "b")]
    done = [2, 0, 3, 1]  # stops at c; stops at b; all three; stops at a
    rows = calvin_subtasks.tally(chains, done)
    # a: done in chains 0 and 2 (it starts both), failed in chain 3; chain 1 stopped before it
    assert rows["a"] == (3, 2, 2, 2)
    # b: done in chains 0 and 2; failed as first in chain 1
    assert rows["b"] == (3, 2, 1, 0)
    # c: failed in chain 0, done in chains 2 and 3 (first of chain 3)
    assert rows["c"] == (3, 2, 1, 1)
    assert sum(a for a, _, _, _ in rows.values()) == 3 + 1 + 3 + 2  # up to the failure, or the whole chain
