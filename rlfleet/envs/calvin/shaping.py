"""Block-subtask progress for `env.progress_reward`: a potential over the scene and the chain's stage.

A subtask that names a block (lift, push, rotate the red / blue / pink block) has the progress

    Phi(s) = 0.5 * (1 - min(d, REACH_RANGE) / REACH_RANGE) + 0.5 * [lift and the block is held]

with d the distance from the tool centre point to that block's centre (reaching it is the first
half of a lift, holding it the second); other subtasks have 0, and so does the end of an episode
(completed, failed or cut). With w = `env.progress_reward` the env pays w * (Phi(s') - Phi(s)) on
every step on top of the 1 for a completed subtask, Phi of the next subtask from the step one
completes (Ng, Harada & Russell 1999, the gamma = 1 form, as RoboTwin's stage shaping). The
shaping sums to -w * Phi(s_0) over an episode, in (-0.5, 0] for w < 1: a return still rounds to
the subtasks completed (which the chain metrics read), a completed block subtask is still worth 1
in all, and an attempt that fails near the block gives back what nearing it paid. It exists
because a start that hovers 7-26 cm from the named block almost never completes a block subtask,
so the sparse reward gives PPO little to move it with (docs/results.md, CALVIN probes).
"""

from __future__ import annotations

import numpy as np

from rlfleet.envs.calvin.scene import Snapshot
from rlfleet.envs.calvin.subtasks import Subtask

REACH_RANGE = 0.30  # m: farther than this from the named block is no progress
BLOCK_KINDS = ("lift", "push", "rotate")


def block_progress(task: Subtask, now: Snapshot) -> float:
    """Phi for `task` in scene `now`, in [0, 1] (0 for subtasks that name no block)."""
    if task.kind not in BLOCK_KINDS or task.color is None:
        return 0.0
    d = float(np.linalg.norm(now.tcp_pos - now.block_pos[task.color]))
    phi = 0.5 * (1.0 - min(d, REACH_RANGE) / REACH_RANGE)
    if task.kind == "lift" and now.grasped[task.color]:
        phi += 0.5
    return phi
