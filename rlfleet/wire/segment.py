"""The trajectory segment: T steps x B envs from one actor, as it travels to the learner.

One schema shared by the producer (actor) and the consumer (learner); `from_tensors` checks
every field's dtype and shape against the others, so a malformed push is rejected cleanly.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from rlfleet.wire.codec import WireFormatError, require


@dataclass
class Segment:
    states: np.ndarray  # [T,B,S] float32: observation each action was chosen from
    actions: np.ndarray  # [T,B,K,D] float32: the sampled (unclipped) action chunk
    logprobs: np.ndarray  # [T,B] float32: behaviour log-prob of the chunk
    values: np.ndarray  # [T,B] float32: behaviour value estimate
    rewards: np.ndarray  # [T,B] float32: reward summed over the chunk
    terminated: np.ndarray  # [T,B] bool
    truncated: np.ndarray  # [T,B] bool
    final_states: np.ndarray  # [T,B,S] float32: pre-reset state where an episode ended
    next_states: np.ndarray  # [B,S] float32: observation after the last step (bootstrap)
    versions: np.ndarray  # [T] int64: policy version that produced step t
    task_ids: np.ndarray  # [B] int64
    env_steps: np.ndarray  # [] int64: simulator steps taken (T*B*K less skipped substeps)
    ep_returns: np.ndarray  # [N] float32: episodes that ended in this segment
    ep_lengths: np.ndarray  # [N] int32
    ep_success: np.ndarray  # [N] bool: success_once
    ep_task_ids: np.ndarray  # [N] int64

    @property
    def num_steps(self) -> int:
        return int(self.states.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.states.shape[1])

    def to_tensors(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_tensors(cls, t: dict) -> "Segment":
        states = require(t, "states", "float32", (None, None, None), finite=True)
        T, B, S = states.shape
        if T == 0 or B == 0:
            raise WireFormatError(f"empty segment: states shape {list(states.shape)}")
        actions = require(t, "actions", "float32", (T, B, None, None), finite=True)
        n = require(t, "ep_returns", "float32", (None,), finite=True).shape[0]
        return cls(
            states=states,
            actions=actions,
            logprobs=require(t, "logprobs", "float32", (T, B), finite=True),
            values=require(t, "values", "float32", (T, B), finite=True),
            rewards=require(t, "rewards", "float32", (T, B), finite=True),
            terminated=require(t, "terminated", "bool", (T, B)),
            truncated=require(t, "truncated", "bool", (T, B)),
            final_states=require(t, "final_states", "float32", (T, B, S), finite=True),
            next_states=require(t, "next_states", "float32", (B, S), finite=True),
            versions=require(t, "versions", "int64", (T,)),
            task_ids=require(t, "task_ids", "int64", (B,)),
            env_steps=require(t, "env_steps", "int64", ()),
            ep_returns=t["ep_returns"],
            ep_lengths=require(t, "ep_lengths", "int32", (n,)),
            ep_success=require(t, "ep_success", "bool", (n,)),
            ep_task_ids=require(t, "ep_task_ids", "int64", (n,)),
        )
