"""RoboTwin-style dual-arm manipulation (ten tasks, two Pandas, primitive objects) on SAPIEN.

State-only mode needs no GPU or Vulkan; images need a Vulkan device (see docs/robotwin.md). The
names below import sapien (~0.5 s) on first use; `rlfleet.envs.robotwin.config` (the env's
settings) does not, so configs load without the simulator.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlfleet.envs.robotwin.env import ACTION_DIM, STATE_DIM, RoboTwinEnv, parse_task, resolve_tasks
    from rlfleet.envs.robotwin.tasks import TASKS

__all__ = ["ACTION_DIM", "STATE_DIM", "TASKS", "RoboTwinEnv", "parse_task", "resolve_tasks"]


def __getattr__(name: str) -> Any:
    if name == "TASKS":
        return importlib.import_module("rlfleet.envs.robotwin.tasks").TASKS
    if name in __all__:
        return getattr(importlib.import_module("rlfleet.envs.robotwin.env"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
