"""MetaWorld v3 tasks (state observations) behind the `ChunkedEnv` API.

The env and its task tables (`rlfleet.envs.metaworld.env`) import metaworld and mujoco (~1 s), on
first use of one of the names below; `rlfleet.envs.metaworld.config` (the env's settings) imports
neither, so configs load without the simulator.
"""

import importlib
import os
from typing import TYPE_CHECKING, Any

# Offscreen EGL rendering unless the user chose a backend: mujoco picks one when first imported,
# so this runs before any module of this package imports it.
os.environ.setdefault("MUJOCO_GL", "egl")

if TYPE_CHECKING:
    from rlfleet.envs.metaworld.env import (
        ALL_TASKS,
        DIFFICULTY,
        TASK_DESCRIPTIONS,
        TASK_SETS,
        MetaWorldEnv,
        resolve_tasks,
    )

__all__ = ["ALL_TASKS", "DIFFICULTY", "TASK_DESCRIPTIONS", "TASK_SETS", "MetaWorldEnv", "resolve_tasks"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("rlfleet.envs.metaworld.env"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
