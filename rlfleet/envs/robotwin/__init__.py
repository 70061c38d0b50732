"""RoboTwin-style dual-arm manipulation (ten tasks, two Pandas, primitive objects) on SAPIEN.

State-only mode needs no GPU or Vulkan; images need a Vulkan device (see docs/robotwin.md).
Importing this package imports sapien (~0.5 s); `rlfleet.envs.make_env` defers it.
"""

from rlfleet.envs.robotwin.env import ACTION_DIM, STATE_DIM, RoboTwinEnv, parse_task, resolve_tasks
from rlfleet.envs.robotwin.tasks import TASKS

__all__ = ["ACTION_DIM", "STATE_DIM", "TASKS", "RoboTwinEnv", "parse_task", "resolve_tasks"]
