"""RoboTwin's env settings (`env.name=robotwin`); imports no simulator, so configs load without it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from rlfleet.envs.api import SPLIT_POOL, EnvConfig

POOLS = ("train", "eval", "validation")

_C = TypeVar("_C", bound="RoboTwinEnvConfig")


@dataclass
class RoboTwinEnvConfig(EnvConfig):
    """EnvConfig plus RoboTwin's own settings."""

    # Which seed files episodes play: "train" or "eval" (the test split): each task item's own
    # (`click_bell:eval` plays the eval file); "validation": every item its validation file.
    # Evaluation selects its split's itself (`held_out`).
    pool: str = "train"
    # Tasks with stages (`Task.progress`, e.g. place_empty_cup): add w * (progress after the step -
    # progress before) to each step's reward, with w this value (0: off). Potential-based shaping
    # (Ng, Harada & Russell 1999): an episode's shaping sums to w * (last - first progress), so it
    # pays for progress the sparse success reward cannot see, not for loitering in a stage.
    progress_reward: float = 0.0

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        if self.progress_reward < 0:
            raise ValueError(f"progress_reward must be >= 0 (0: off), got {self.progress_reward}")

    def held_out(self: _C, split: str) -> _C:
        """The split's seed files."""
        return dataclasses.replace(super().held_out(split), pool=SPLIT_POOL[split])
