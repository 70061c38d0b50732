"""Which rows of an update each learner rank trains on under DDP (torchrun).

Every rank receives the same segments. The one-process batch is every row of every segment,
(segment j, step t, env b) at offset_j + t * B_j + b, with a validity mask (young enough, kept by
the estimator) that every rank computes alike. A rank prepares only its share of the env columns
(:func:`shard_rows`, :func:`segment_envs`): columns keep their time steps together, which GAE and
V-trace run along. Minibatches are drawn over the one-process valid rows, so each is split
exactly between the ranks (:func:`minibatch_rows`); each rank's loss divides its sum over its rows
by the one-process minibatch size over world_size (:class:`MinibatchMean`), so DDP's average of
the ranks' gradients is the one-process gradient.

A rank with no row in a minibatch (fewer env columns than ranks, or its rows all too old) still
steps with the others (every rank must join every gradient all-reduce, or DDP hangs): it runs one
of its rows with weight zero. A rank with no env column at all holds column 0 of the first
segment for that, every row masked (row id -1).

Nothing here talks to other ranks; the collectives are in :mod:`rlfleet.learner.distributed`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from rlfleet.wire.segment import Segment


@dataclass
class RowShard:
    """One rank's share of an update: the env columns of each segment it prepares, and where its
    rows sit in the one-process batch, so minibatches drawn over that order split exactly."""

    parts: list[tuple[int, np.ndarray]]  # (segment index, env columns), columns ascending
    row_ids: torch.Tensor  # [local rows] long: each local row's one-process position (-1: held, not trained)
    valid: torch.Tensor  # [one-process rows] bool: rows to train on (the same on every rank)
    world_size: int
    task_range: tuple[int, int]  # lowest and highest task id of every segment's envs (every rank's)

    @property
    def num_rows(self) -> int:
        """Rows trained on, all ranks together."""
        return int(self.valid.sum())

    def local_valid(self) -> torch.Tensor:
        """[local rows] bool: this rank's rows to train on."""
        held = self.row_ids >= 0
        return held & self.valid[self.row_ids.clamp(min=0)]

    def local_positions(self) -> torch.Tensor | None:
        """where[i]: the local position of one-process row i, or -1 where another rank holds it.
        None when this rank holds every row in order (one process): positions are the row ids."""
        n = len(self.valid)
        if len(self.row_ids) == n and torch.equal(self.row_ids, torch.arange(n, device=self.row_ids.device)):
            return None
        where = torch.full((n,), -1, dtype=torch.long, device=self.valid.device)
        held = (self.row_ids >= 0).nonzero().squeeze(-1)
        where[self.row_ids[held]] = held
        return where


def whole_batch(valid: torch.Tensor, task_ids: torch.Tensor) -> RowShard:
    """One process's shard of a prepared batch: every row, in order (``task_ids``: the batch's)."""
    task_range = (int(task_ids.min()), int(task_ids.max())) if len(task_ids) else (0, 0)
    return RowShard([], torch.arange(len(valid), device=valid.device), valid, 1, task_range)


def shard_rows(segments: list[Segment], valid: torch.Tensor, rank: int, world_size: int) -> RowShard:
    """Env column g (counted over all segments in order) goes to rank g % world_size.

    Splitting by env keeps each column's time steps together (GAE runs along them) and balances
    the ranks to within one column per segment. ``valid`` ([rows of all segments] bool, step-major
    per segment) marks the rows to train on.
    """
    parts, ids, offset, env_offset = [], [], 0, 0
    for j, seg in enumerate(segments):
        T, B = seg.num_steps, seg.num_envs
        cols = np.flatnonzero((env_offset + np.arange(B)) % world_size == rank)
        if len(cols):
            parts.append((j, cols))
            ids.append((offset + np.arange(T)[:, None] * B + cols[None, :]).reshape(-1))
        offset += T * B
        env_offset += B
    if len(valid) != offset:
        raise ValueError(f"valid has {len(valid)} rows, the segments {offset}")
    if not parts and segments:  # no column here: hold one, masked, so that this rank steps too
        parts, ids = [(0, np.arange(1))], [np.full(segments[0].num_steps, -1)]
    row_ids = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
    tasks = [s.task_ids for s in segments if s.num_envs]
    task_range = (min(int(t.min()) for t in tasks), max(int(t.max()) for t in tasks)) if tasks else (0, 0)
    return RowShard(parts, torch.as_tensor(row_ids, device=valid.device), valid, world_size, task_range)


def segment_envs(seg: Segment, cols: np.ndarray) -> Segment:
    """The sub-segment of some env columns (episode records stay whole: only rank 0's metrics read them)."""
    if len(cols) == seg.num_envs:
        return seg

    def pick(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v[:, cols] for k, v in d.items()}

    return replace(
        seg,
        obs=pick(seg.obs),
        actions=seg.actions[:, cols],
        logprobs=seg.logprobs[:, cols],
        values=seg.values[:, cols],
        rewards=seg.rewards[:, cols],
        terminated=seg.terminated[:, cols],
        truncated=seg.truncated[:, cols],
        final_obs=pick(seg.final_obs),
        next_obs={k: v[cols] for k, v in seg.next_obs.items()},
        task_ids=seg.task_ids[cols],
        extras=pick(seg.extras),
        group_ids=seg.group_ids[cols] if len(seg.group_ids) else seg.group_ids,
    )


def minibatch_size(num_rows: int, num_minibatches: int) -> int:
    """Rows per minibatch (at least one); a remainder of num_rows is left out of the epoch."""
    return max(1, num_rows // num_minibatches)


def minibatch_rows(shard: RowShard, order: torch.Tensor, mb_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch: this rank's (local rows, weight) of each minibatch.

    ``order`` permutes the one-process valid rows (the same on every rank); minibatch m is its
    slice [m * mb_size, (m + 1) * mb_size), and each rank takes the rows it holds. Every rank
    yields the same number of minibatches; one with no row of a minibatch yields its first row
    with weight False (it must still step with the others).
    """
    valid_ids = shard.valid.nonzero().squeeze(-1)
    where = shard.local_positions()
    for start in range(0, len(order) - mb_size + 1, mb_size):
        rows = valid_ids[order[start : start + mb_size]]
        if where is not None:
            rows = where[rows]
            rows = rows[rows >= 0]
        if len(rows):
            yield rows, torch.ones(len(rows), dtype=torch.bool, device=rows.device)
        else:
            yield (
                torch.zeros(1, dtype=torch.long, device=rows.device),
                torch.zeros(1, dtype=torch.bool, device=rows.device),
            )


class MinibatchMean:
    """The means one minibatch step takes on this rank's rows ([n, *P] per-row or per-element values).

    ``weight`` [n] marks the rows that count (False: a row this rank runs only to step with the
    others); ``loss_rows`` is the one-process minibatch size over world_size, so the loss mean,
    summed over a rank's rows and averaged by DDP over ranks, is the one-process mean.
    """

    def __init__(self, weight: torch.Tensor, loss_rows: float):
        self.weight, self.loss_rows = weight, loss_rows
        self.rows = int(weight.sum())

    def _masked_sum(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(self.weight.reshape(-1, *[1] * (x.dim() - 1)), x, 0.0).sum()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The loss's mean: this rank's share of the mean over the whole minibatch."""
        return self._masked_sum(x) / (self.loss_rows * _elements_per_row(x))

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """The mean over this rank's counted rows (statistics)."""
        return self._masked_sum(x) / (self.rows * _elements_per_row(x))

    def count(self, flags: torch.Tensor) -> torch.Tensor:
        """How many of this rank's counted elements are True (a tensor: read it with others at once)."""
        return self._masked_sum(flags)

    def elements(self, x: torch.Tensor) -> int:
        """This rank's counted elements of a per-row value."""
        return self.rows * _elements_per_row(x)


def _elements_per_row(x: torch.Tensor) -> int:
    return math.prod(x.shape[1:])
