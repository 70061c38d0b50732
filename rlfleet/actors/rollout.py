"""Assembles T-step trajectory segments for one pipeline stage from the shared-memory slots."""

from __future__ import annotations

import numpy as np

from rlfleet.wire.segment import Segment
from rlfleet.wire.shm import Layout
from rlfleet.wire.slots import obs_keys


class SegmentBuilder:
    """Rows lo:hi of an actor's slots (one pipeline stage), T steps at a time.

    ``group_ids`` (GRPO, see rlfleet.actors.groups): segments are whole episodes, so only each
    env's first episode end in a segment is an episode; a later one closes the auto-reset's
    leftover episode, which the learner masks out, and is not reported.
    """

    def __init__(self, T: int, lo: int, hi: int, layout: Layout, group_ids: np.ndarray | None = None):
        self.T, self.lo, self.hi = T, lo, hi
        B = hi - lo
        self.group_ids = np.zeros(0, np.int64) if group_ids is None else np.asarray(group_ids, np.int64)
        if len(self.group_ids) not in (0, B):
            raise ValueError(f"group_ids must have one label per env row ({B}), got {len(self.group_ids)}")
        self.in_episode = np.ones(B, bool)  # GRPO: the segment's episode has not ended yet
        self._layout, self._B = layout, B
        self.obs_keys = obs_keys(layout)
        self.extra_slots = [k for k in layout if k.startswith("extra.")]
        self._alloc()
        self.t = 0
        self._episodes: list[tuple[float, int, bool, int]] = []

    def _alloc(self) -> None:
        """Fresh buffers for the next segment: `finish` hands the filled ones to the Segment
        instead of copying them, and fresh zeros spare zeroing `final_obs` step by step."""
        T, B, layout = self.T, self._B, self._layout

        def rows(name: str) -> np.ndarray:
            spec = layout[name]
            return np.zeros((T, B, *spec.shape[1:]), spec.dtype)

        self.obs = {k: rows(k) for k in self.obs_keys}
        self.final_obs = {k: rows(k) for k in self.obs_keys}
        self.extras = {k: rows(k) for k in self.extra_slots}
        self.actions = rows("actions")
        self.logprobs = rows("logprobs")
        self.values = rows("values")
        self.rewards = np.zeros((T, B), np.float32)
        self.terminated = np.zeros((T, B), bool)
        self.truncated = np.zeros((T, B), bool)
        self.versions = np.zeros((T,), np.int64)
        self.env_steps = 0  # substeps simulated in this segment (a chunk cut by an episode end counts fewer)

    def record_policy(self, slots, version: int) -> None:
        t, r = self.t, slice(self.lo, self.hi)
        for k in self.obs_keys:
            self.obs[k][t] = slots[k][r]
        for k in self.extra_slots:
            self.extras[k][t] = slots[k][r]
        self.actions[t] = slots["actions"][r]
        self.logprobs[t] = slots["logprobs"][r]
        self.values[t] = slots["values"][r]
        self.versions[t] = version

    def record_step(self, slots) -> int:
        """Record the stage's chunk step; returns the env steps it simulated (see `Segment.env_steps`)."""
        t, lo, r = self.t, self.lo, slice(self.lo, self.hi)
        ran = int(slots["substeps"][r].sum())
        self.env_steps += ran
        self.rewards[t] = slots["rewards"][r].sum(axis=1)
        self.terminated[t] = slots["terminated"][r]
        self.truncated[t] = slots["truncated"][r]
        done = slots["episode_done"][r]
        if len(self.group_ids):
            done = done & self.in_episode
            self.in_episode &= ~done
        if done.any():  # final_obs rows stay zero elsewhere (fresh buffers each segment)
            idx = np.flatnonzero(done)
            for k in self.obs_keys:
                self.final_obs[k][t, idx] = slots[f"final_{k}"][r][idx]
            rows = idx + lo
            self._episodes.extend(
                zip(
                    slots["episode_return"][rows].astype(np.float64).tolist(),
                    slots["episode_length"][rows].tolist(),
                    slots["episode_success_once"][rows].tolist(),
                    slots["task_ids"][rows].tolist(),
                )
            )
        self.t += 1
        return ran

    @property
    def full(self) -> bool:
        return self.t == self.T

    def finish(self, slots) -> Segment:
        """Package the T recorded steps; the current observation becomes the bootstrap one."""
        eps, r = self._episodes, slice(self.lo, self.hi)
        seg = Segment(  # the filled buffers themselves: _alloc gives the builder new ones
            obs=self.obs,
            actions=self.actions,
            logprobs=self.logprobs,
            values=self.values,
            rewards=self.rewards,
            terminated=self.terminated,
            truncated=self.truncated,
            final_obs=self.final_obs,
            next_obs={k: np.array(slots[k][r]) for k in self.obs_keys},
            versions=self.versions,
            task_ids=np.array(slots["task_ids"][r]),
            env_steps=np.array(self.env_steps, np.int64),
            ep_returns=np.array([e[0] for e in eps], np.float32),
            ep_lengths=np.array([e[1] for e in eps], np.int32),
            ep_success=np.array([e[2] for e in eps], bool),
            ep_task_ids=np.array([e[3] for e in eps], np.int64),
            extras={k[len("extra.") :]: v for k, v in self.extras.items()},
            group_ids=self.group_ids.copy(),
        )
        self._alloc()
        self.t, self._episodes = 0, []
        self.in_episode[:] = True
        return seg
