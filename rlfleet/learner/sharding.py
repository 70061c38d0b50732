"""Which rows of an update each learner rank trains on under DDP (torchrun).

Every rank receives the same segments. A rank prepares only its share of the env columns
(:func:`shard_rows`, :func:`segment_envs`): columns keep their time steps together, which GAE and
V-trace run along. Minibatches are drawn over the *one-process* row order (the order one learner
process would use), so each minibatch is split exactly between the ranks
(:func:`minibatch_rows`), and each rank scales its loss by its share of the minibatch
(:func:`loss_share`): DDP's average of the ranks' gradients is then the one-process gradient.

A rank whose share of a minibatch is empty (fewer env columns than ranks, or all its rows too
old) still runs a forward and backward pass, with weight zero, on a *stand-in* row
(:func:`stand_in_columns`): every rank must join every gradient all-reduce, or DDP hangs.

Nothing here talks to other ranks; the collectives are in :mod:`rlfleet.learner.distributed`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from rlfleet.algorithms import lag_mask, policy_lag
from rlfleet.wire.segment import Segment


@dataclass
class RowShard:
    """One rank's share of an update: the env columns of each segment it prepares, and where its
    rows sit in the one-process batch order, so minibatches drawn over that order split exactly."""

    parts: list[tuple[int, np.ndarray]]  # (segment index, env columns), columns ascending
    row_ids: np.ndarray  # [local rows] int64: position of each local row in the one-process batch
    num_rows: int  # rows kept on all ranks together

    def local_positions(self, device: str | torch.device = "cpu") -> torch.Tensor | None:
        """where[i]: the local position of one-process row i, or -1 where another rank holds it.
        None when this rank holds every row in order (one process): positions are the row ids."""
        if len(self.row_ids) == self.num_rows and np.array_equal(self.row_ids, np.arange(self.num_rows)):
            return None
        where = torch.full((self.num_rows,), -1, dtype=torch.long, device=device)
        where[torch.as_tensor(self.row_ids, device=device)] = torch.arange(len(self.row_ids), device=device)
        return where


def kept_steps(seg: Segment, version: int, max_policy_lag: int) -> np.ndarray:
    """Time steps young enough to train on (the trainer drops whole steps, all envs at once)."""
    lags = policy_lag(version, torch.tensor(np.asarray(seg.versions)))
    return np.flatnonzero(lag_mask(lags, max_policy_lag).numpy())


def shard_rows(
    segments: list[Segment],
    version: int,
    max_policy_lag: int,
    rank: int,
    world_size: int,
    row_masks: list[np.ndarray] | None = None,
) -> RowShard:
    """Env column g (counted over all segments in order) goes to rank g % world_size.

    Splitting by env keeps each column's time steps together (GAE runs along them) and balances
    the ranks to within one column per segment. The one-process batch is the segments' kept steps
    in order, each step's envs in order, so row (segment j, k-th kept step, env b) sits at
    offset_j + k * B_j + b. ``row_masks`` ([T, B] bool per segment; GRPO's valid steps of kept
    groups) drop single rows as well; the order stays step-major over the rows kept.
    """
    parts, ids, offset, env_offset = [], [], 0, 0
    for j, seg in enumerate(segments):
        B = seg.num_envs
        keep = np.zeros((seg.num_steps, B), bool)
        keep[kept_steps(seg, version, max_policy_lag)] = True
        if row_masks is not None:
            keep &= np.asarray(row_masks[j], bool)
        kept = np.flatnonzero(keep.reshape(-1))  # one-process order: step-major, envs ascending
        cols = np.flatnonzero((env_offset + np.arange(B)) % world_size == rank)
        if len(cols):
            parts.append((j, cols))
            ids.append(offset + np.flatnonzero(np.isin(kept % B, cols)))
        offset += len(kept)
        env_offset += B
    row_ids = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
    return RowShard(parts, row_ids, offset)


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


def stand_in_columns() -> np.ndarray:
    """The env columns (of the first segment) a rank prepares as its zero-weight stand-in row: the
    loss must reach every parameter on every rank, so any row of the right shapes will do."""
    return np.arange(1)


def minibatch_size(num_rows: int, num_minibatches: int) -> int:
    """Rows per minibatch (at least one); a remainder of num_rows is left out of the epoch."""
    return max(1, num_rows // num_minibatches)


def minibatch_rows(where: torch.Tensor | None, perm: torch.Tensor, mb_size: int) -> Iterator[torch.Tensor]:
    """This rank's local rows of each minibatch of one epoch.

    ``perm`` orders the one-process rows (the same on every rank); minibatch m is its slice
    [m * mb_size, (m + 1) * mb_size), and each rank keeps the rows it holds (``where`` from
    :meth:`RowShard.local_positions`). Every rank yields the same number of minibatches, some
    possibly empty. ``where`` None (the rank holds every row): the slices of ``perm`` themselves.
    """
    for start in range(0, len(perm) - mb_size + 1, mb_size):
        rows = perm[start : start + mb_size]
        if where is None:
            yield rows
            continue
        local = where[rows]
        yield local[local >= 0]


def loss_share(world_size: int, local_rows: int, mb_size: int) -> float:
    """Factor on a rank's mean loss over its ``local_rows`` of a ``mb_size``-row minibatch: DDP
    averages gradients over ranks, so world_size * local_rows / mb_size makes that average the
    gradient of the mean over the whole minibatch."""
    return world_size * local_rows / mb_size
