"""MetaWorld v3 tasks (state observations) behind the `ChunkedEnv` API.

Importing this package imports metaworld and mujoco (~1 s); `rlfleet.envs.make_env` defers it.
"""

from rlfleet.envs.metaworld.env import (
    ALL_TASKS,
    DIFFICULTY,
    TASK_DESCRIPTIONS,
    TASK_SETS,
    MetaWorldEnv,
    resolve_tasks,
)

__all__ = ["ALL_TASKS", "DIFFICULTY", "TASK_DESCRIPTIONS", "TASK_SETS", "MetaWorldEnv", "resolve_tasks"]
