"""CALVIN's env settings (`env.name=calvin`); imports no simulator, so configs load without it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from rlfleet.envs.api import SPLIT_POOL, EnvConfig
from rlfleet.envs.calvin.chains import POOLS

_C = TypeVar("_C", bound="CalvinEnvConfig")


@dataclass
class CalvinEnvConfig(EnvConfig):
    """EnvConfig plus CALVIN's own settings."""

    # The chain pool episodes are drawn from: "train", "eval" (the test split) or "validation".
    # Evaluation selects its split's pool itself (`held_out`).
    pool: str = "train"
    # Env steps the current subtask may take before the episode is truncated; 0: CALVIN's own
    # budget (360). Training only: held-out evaluation keeps the benchmark's budget (`held_out`).
    # A shorter training budget stops spending env steps on an attempt long after it has failed.
    subtask_steps: int = 0
    # Add w * (block progress after the step - before) to each step's reward, w this value in
    # [0, 1) (0: off): potential-based shaping (rlfleet.envs.calvin.shaping).
    progress_reward: float = 0.0

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        if self.subtask_steps < 0:
            raise ValueError(f"subtask_steps must be >= 0 (0: the env's own budget), got {self.subtask_steps}")
        if self.progress_reward < 0:
            raise ValueError(f"progress_reward must be >= 0 (0: off), got {self.progress_reward}")

    def held_out(self: _C, split: str) -> _C:
        """The split's chain pool, at the benchmark's per-subtask budget."""
        return dataclasses.replace(super().held_out(split), pool=SPLIT_POOL[split], subtask_steps=0)
