"""The env settings of gymnasium envs (`env.name=gym:<id>`); imports no gymnasium."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlfleet.envs.api import EnvConfig

RENDER_QUALITIES = ("fast", "env")


@dataclass
class GymEnvConfig(EnvConfig):
    """EnvConfig plus the settings of a gymnasium env."""

    # The info key that says the task is solved ("": "is_success" or "success")
    success_key: str = ""
    # Keyword arguments for `gym.make` (e.g. {reward_type: dense}), in every process that makes the env
    gym_kwargs: dict[str, Any] = field(default_factory=dict)
    # MuJoCo envs rendering `main_images`: "fast" turns the scene's shadow maps and multisampling
    # off (a CPU renderer spends most of a frame on them: docs/simulators.md); "env": as the env ships it.
    gym_render_quality: str = "fast"

    def __post_init__(self) -> None:
        if self.gym_render_quality not in RENDER_QUALITIES:
            raise ValueError(f"gym_render_quality must be 'fast' or 'env', got {self.gym_render_quality!r}")
