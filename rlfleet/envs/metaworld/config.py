"""MetaWorld's env settings (`env.name=metaworld`); imports no simulator, so configs load without it."""

from __future__ import annotations

from dataclasses import dataclass

from rlfleet.envs.api import EnvConfig


@dataclass
class MetaWorldEnvConfig(EnvConfig):
    """EnvConfig plus MetaWorld's own settings."""

    # Draw the task's `goal` site (where it has one) as a green sphere of this radius (m) in
    # `main_images`; 0: as the task ships it (a 1.5-2 cm red dot, a pixel or two at 64 px). Only the
    # frames change: sites never collide, and rewards and success ignore their size.
    goal_marker_size: float = 0.0

    def __post_init__(self) -> None:
        if self.goal_marker_size < 0:
            raise ValueError(f"goal_marker_size must be >= 0 (0: as the task ships it), got {self.goal_marker_size}")
