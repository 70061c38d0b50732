"""The actor side of GRPO: whole-episode segments and grouped, seeded resets.

In GRPO mode (``algorithm.adv_type: grpo``) every segment is one episode long,
``T = max_episode_steps / chunk_size`` chunk steps, and every env of a pipeline stage is reset
with the stage's last step of each segment (the worker's ``step_reset`` command), so the next
segment starts at an episode start. A group is G envs of one stage that run the same task and
are reset with the same seed: same initial state, different sampled actions. Groups never span
stages (each stage builds its own segments), so a group never spans segments.

The checks on a GRPO run's shape (whole-episode segments, whole groups per stage, G envs of a
task per group) live with GRPO in :mod:`rlfleet.algorithms.grpo`: the learner and the actor both
run them. They are re-exported here only for the actor's existing imports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlfleet.algorithms.grpo import check_task_rows
from rlfleet.envs.core import entropy_seed


@dataclass
class StageGroups:
    """Group label of each row of one stage (rows relative to the stage's first row)."""

    group_ids: np.ndarray  # [rows] int64, 0 .. num_groups-1

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.max()) + 1 if len(self.group_ids) else 0


def stage_groups(task_ids: np.ndarray, group_size: int, stage: int = 0) -> StageGroups:
    """Rows with the same task, in row order, form groups of ``group_size``.

    Why by task: an env's task is fixed by the adapter (MetaWorld cycles tasks over env
    indices), and a group must share its task as well as its seed. Every task's row count in
    the stage must be a multiple of G (:func:`rlfleet.algorithms.grpo.check_task_rows`).
    """
    task_ids = np.asarray(task_ids)
    check_task_rows(task_ids, group_size, stage)
    out = np.full(len(task_ids), -1, np.int64)
    next_group = 0
    for task in dict.fromkeys(task_ids.tolist()):  # first-appearance order: deterministic
        rows = np.flatnonzero(task_ids == task)
        for k in range(0, len(rows), group_size):
            out[rows[k : k + group_size]] = next_group
            next_group += 1
    return StageGroups(out)


def group_seeds(
    base_seed: int, actor_index: int, stage: int, round_index: int, num_groups: int, stream: int = 0
) -> np.ndarray:
    """One 63-bit episode seed per group: SeedSequence([base, actor, stage, round, group(, stream)]).

    Distinct (up to 2^-63-chance collisions) across actors, stages, segments (``round_index``
    counts a stage's segments) and groups; reproducible run to run. A resumed run passes
    ``stream`` (the env steps it resumed from) so its rounds, which count from 0 again, draw new seeds.
    """
    tail = [stream] if stream else []
    return np.array(
        [entropy_seed([base_seed, actor_index, stage, round_index, g, *tail]) for g in range(num_groups)], np.int64
    )


class GroupedResets:
    """Seeds for an actor's stage resets: env row r of stage s gets the seed of its group."""

    def __init__(
        self,
        stage_rows: list[tuple[int, int]],
        task_ids: np.ndarray,
        group_size: int,
        base_seed: int,
        actor_index: int,
        stream: int = 0,
    ):
        self.stage_rows = stage_rows
        self.base_seed, self.actor_index, self.stream = base_seed, actor_index, stream
        self.groups = [stage_groups(task_ids[lo:hi], group_size, s) for s, (lo, hi) in enumerate(stage_rows)]
        self.rounds = [0] * len(stage_rows)  # segments started per stage

    def next_seeds(self, stage: int, out: np.ndarray) -> None:
        """Write the stage's seeds for its next segment into ``out`` (all E rows) and count the round."""
        lo, hi = self.stage_rows[stage]
        g = self.groups[stage]
        seeds = group_seeds(self.base_seed, self.actor_index, stage, self.rounds[stage], g.num_groups, self.stream)
        out[lo:hi] = seeds[g.group_ids]
        self.rounds[stage] += 1

    def all_seeds(self) -> np.ndarray:
        """Seeds for every row (the first reset of all stages)."""
        out = np.zeros(self.stage_rows[-1][1], np.int64)
        for s in range(len(self.stage_rows)):
            self.next_seeds(s, out)
        return out
