"""Reward shaping for the block subtasks (`reward_type: dense`): a potential over the scene.

A subtask that names a block (lift, push, rotate the red / blue / pink block) gets the potential

    phi(s) = REACH_WEIGHT * (1 - min(d, REACH_RANGE) / REACH_RANGE) + GRASP_WEIGHT * [lift and grasped]

with d the distance from the tool centre point to that block's centre; other subtasks get 0. The
potential is one of the scene and the chain's stage, Phi(s, k) = phi_k(s), and 0 once the episode
ends (completed, failed or cut); the env pays Phi(s', k') - Phi(s, k) on every step on top of the
1 for a completed subtask (Ng et al., 1999, with gamma = 1). So the shaping sums to -Phi(s_0, 0)
over an episode, in [-REACH_WEIGHT, 0]: a return still rounds to the subtasks completed (which
the chain metrics read), completing a block subtask is still worth 1 in all, and leaving the
block (or failing near it) takes back what nearing it paid. It exists because a start that
hovers 7-26 cm from the named block never completes a block subtask by chance, so the sparse
reward gives PPO nothing to move it with (docs/results.md, CALVIN probes).
"""

from __future__ import annotations

import numpy as np

from rlfleet.envs.calvin.scene import Snapshot
from rlfleet.envs.calvin.subtasks import Subtask

REACH_RANGE = 0.30  # m: farther than this from the block pays nothing
REACH_WEIGHT = 0.2  # what bringing the hand from REACH_RANGE onto the block is worth (a subtask is 1)
GRASP_WEIGHT = 0.2  # what holding the named block is worth while lifting it
_BLOCK_KINDS = ("lift", "push", "rotate")


def block_potential(task: Subtask, now: Snapshot) -> float:
    """phi for `task` in scene `now` (0 for subtasks that name no block)."""
    if task.kind not in _BLOCK_KINDS or task.color is None:
        return 0.0
    d = float(np.linalg.norm(now.tcp_pos - now.block_pos[task.color]))
    phi = REACH_WEIGHT * (1.0 - min(d, REACH_RANGE) / REACH_RANGE)
    if task.kind == "lift" and now.grasped[task.color]:
        phi += GRASP_WEIGHT
    return phi
