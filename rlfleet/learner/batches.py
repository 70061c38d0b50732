"""An update's batch of `learner.batch_samples` samples, whatever the segments' size: whole
segments, then the env columns of the last one that complete the batch; the other columns are
carried to the next update (in front of it, so the queue stays in arrival order).

A column is one env's T steps (GAE runs along it), so a batch is exact when batch_samples is a
multiple of T, else it takes the columns that reach it (less than T samples more). A GRPO group's
columns stay together: a group is one advantage baseline.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rlfleet.learner.sharding import segment_envs
from rlfleet.wire.segment import Segment


def samples(segments: list[Segment]) -> int:
    return sum(s.num_steps * s.num_envs for s in segments)


def take_batch(segments: list[Segment], batch_samples: int) -> tuple[list[Segment], list[Segment]]:
    """(this update's segments, the rest to carry): the first holds `batch_samples` samples when
    the segments hold that many (rounded up to a whole column or group), the rest what is left."""
    taken: list[Segment] = []
    have = 0
    for i, seg in enumerate(segments):
        if have >= batch_samples:
            return taken, segments[i:]
        size = seg.num_steps * seg.num_envs
        if have + size <= batch_samples:
            taken.append(seg)
            have += size
            continue
        head, tail = split_columns(seg, -(-(batch_samples - have) // seg.num_steps))
        taken.append(head)
        return taken, ([tail] if tail is not None else []) + segments[i + 1 :]
    return taken, []


def _column_units(seg: Segment) -> list[np.ndarray]:
    """The columns that must stay together, in column order: one each, or a GRPO group's."""
    if not len(seg.group_ids):
        return [np.array([c]) for c in range(seg.num_envs)]
    _, first = np.unique(seg.group_ids, return_index=True)
    return [np.flatnonzero(seg.group_ids == seg.group_ids[i]) for i in sorted(first)]


def split_columns(seg: Segment, columns: int) -> tuple[Segment, Segment | None]:
    """The segment's first `columns` env columns (more to finish a group) and the rest (None when
    nothing is left). Env steps are shared by rows (a segment counts only its total); the
    episodes that ended in it stay with the head, so nothing is counted twice."""
    units, head_cols = _column_units(seg), list[int]()
    while units and len(head_cols) < columns:
        head_cols.extend(units.pop(0).tolist())
    if not units:
        return seg, None
    tail_cols = np.sort(np.concatenate(units))
    head_idx = np.array(sorted(head_cols))
    steps = int(seg.env_steps)
    head_steps = steps * len(head_idx) // seg.num_envs
    none = slice(0, 0)
    head = replace(segment_envs(seg, head_idx), env_steps=np.asarray(head_steps, np.int64))
    tail = replace(
        segment_envs(seg, tail_cols),
        env_steps=np.asarray(steps - head_steps, np.int64),
        ep_returns=seg.ep_returns[none],
        ep_lengths=seg.ep_lengths[none],
        ep_success=seg.ep_success[none],
        ep_task_ids=seg.ep_task_ids[none],
    )
    return head, tail
