"""Scene settings: `clean` (RoboTwin's clean table) and `randomized` (clutter, colours, table height, light).

Selected per task by the config string (`"place_empty_cup:randomized"`). Distractors are built once
per env and laid out every episode away from the task's objects; colours and light only show when
rendering, table height changes physics too (the arms stay where they are).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlfleet.envs.robotwin.scene import DualArmScene, Part
from rlfleet.envs.robotwin.tasks import Task


@dataclass(frozen=True)
class Setting:
    """How much an episode's scene varies beyond the task's own object layout."""

    name: str
    table_height: float = 0.0  # the table top moves uniformly within +- this (m)
    distractors: int = 0  # clutter objects on the table
    random_colors: bool = False  # task objects, distractors and table get random colours
    light_jitter: float = 0.0  # +- change of ambient and directional light intensity


SETTINGS: dict[str, Setting] = {
    "clean": Setting("clean"),
    "randomized": Setting("randomized", table_height=0.03, distractors=3, random_colors=True, light_jitter=0.3),
}

_DISTRACTOR_PARTS = [
    [Part("box", (0.02, 0.02, 0.02), (0.0, 0.0, 0.02))],
    [Part("cylinder", (0.02, 0.025), (0.0, 0.0, 0.025))],
    [Part("box", (0.03, 0.015, 0.012), (0.0, 0.0, 0.012))],
    [Part("cylinder", (0.03, 0.01), (0.0, 0.0, 0.01))],
]
_PARK = np.array([0.95, 0.0])  # far table edge, out of reach, for distractors that found no free spot


class Clutter:
    """The distractor objects of one env and the per-episode scene variation of its setting."""

    def __init__(self, scene: DualArmScene, setting: Setting) -> None:
        self.s = scene
        self.setting = setting
        self.objects = [
            scene.add_object(
                f"distractor_{i}", _DISTRACTOR_PARTS[i % len(_DISTRACTOR_PARTS)], color=(0.5, 0.5, 0.5), density=300
            )
            for i in range(setting.distractors)
        ]

    def table_height(self, rng: np.random.Generator) -> float:
        """Draw this episode's table height (call before the task lays out its objects)."""
        h = self.setting.table_height
        return float(rng.uniform(-h, h)) if h > 0 else 0.0

    def layout(self, task: Task, rng: np.random.Generator) -> None:
        """Scatter distractors clear of the task's objects; recolour and relight when rendering."""
        for i, obj in enumerate(self.objects):
            xy = task.sample_xy(rng, (0.3, -0.45), (0.68, 0.45), 0.07)
            if any(np.linalg.norm(xy - p) < 0.07 + r for p, r in task.footprints[:-1]):
                xy = _PARK + np.array([0.0, 0.1 * i - 0.1])
            task.put(obj, xy, yaw=float(rng.uniform(-np.pi, np.pi)))
        if self.setting.random_colors:
            colours = rng.uniform(0.05, 0.95, size=(len(self.objects) + len(task.key_objects()) + 1, 3))
            for obj, rgb in zip([self.s.table, *self.objects, *task.key_objects()], colours):
                self.s.set_color(obj, tuple(rgb))
        if self.setting.light_jitter and self.s.visual:
            j = self.setting.light_jitter
            self.s.scene.set_ambient_light(list(0.4 * (1.0 + rng.uniform(-j, j)) * np.ones(3)))
