"""Assembles T-step trajectory segments for one pipeline stage from the shared-memory slots."""
from __future__ import annotations

import numpy as np

from rlfleet.wire.segment import Segment


class SegmentBuilder:
    def __init__(self, T: int, B: int, S: int, K: int, D: int):
        self.T, self.B, self.K = T, B, K
        self.states = np.zeros((T, B, S), np.float32)
        self.actions = np.zeros((T, B, K, D), np.float32)
        self.logprobs = np.zeros((T, B), np.float32)
        self.values = np.zeros((T, B), np.float32)
        self.rewards = np.zeros((T, B), np.float32)
        self.terminated = np.zeros((T, B), bool)
        self.truncated = np.zeros((T, B), bool)
        self.final_states = np.zeros((T, B, S), np.float32)
        self.versions = np.zeros((T,), np.int64)
        self.t = 0
        self._episodes: list[tuple[float, int, bool, int]] = []

    def record_policy(self, slots, lo: int, hi: int, version: int) -> None:
        t = self.t
        self.states[t] = slots["states"][lo:hi]
        self.actions[t] = slots["actions"][lo:hi]
        self.logprobs[t] = slots["logprobs"][lo:hi]
        self.values[t] = slots["values"][lo:hi]
        self.versions[t] = version

    def record_step(self, slots, lo: int, hi: int) -> None:
        t = self.t
        self.rewards[t] = slots["rewards"][lo:hi].sum(axis=1)
        self.terminated[t] = slots["terminated"][lo:hi]
        self.truncated[t] = slots["truncated"][lo:hi]
        done = slots["episode_done"][lo:hi]
        self.final_states[t] = 0.0
        if done.any():
            idx = np.flatnonzero(done)
            self.final_states[t, idx] = slots["final_states"][lo:hi][idx]
            task_ids = slots["task_ids"][lo:hi]
            for i in idx:
                self._episodes.append((float(slots["episode_return"][lo + i]), int(slots["episode_length"][lo + i]),
                                       bool(slots["episode_success_once"][lo + i]), int(task_ids[i])))
        self.t += 1

    @property
    def full(self) -> bool:
        return self.t == self.T

    def finish(self, slots, lo: int, hi: int) -> Segment:
        """Package the T recorded steps; the current states become the bootstrap observation."""
        eps = self._episodes
        seg = Segment(
            states=self.states.copy(), actions=self.actions.copy(), logprobs=self.logprobs.copy(),
            values=self.values.copy(), rewards=self.rewards.copy(), terminated=self.terminated.copy(),
            truncated=self.truncated.copy(), final_states=self.final_states.copy(),
            next_states=np.array(slots["states"][lo:hi]), versions=self.versions.copy(),
            task_ids=np.array(slots["task_ids"][lo:hi]), env_steps=np.array(self.T * self.B * self.K, np.int64),
            ep_returns=np.array([e[0] for e in eps], np.float32), ep_lengths=np.array([e[1] for e in eps], np.int32),
            ep_success=np.array([e[2] for e in eps], bool), ep_task_ids=np.array([e[3] for e in eps], np.int64),
        )
        self.t, self._episodes = 0, []
        return seg
