"""MetaWorld v3 tasks (state observations) behind the `ChunkedEnv` API.

Importing this package imports metaworld and mujoco (~1 s); `rlfleet.envs.make_env` defers it.
"""

import os

# Offscreen EGL rendering unless the user chose a backend: mujoco picks one when first imported,
# so this runs before any module of this package imports it.
os.environ.setdefault("MUJOCO_GL", "egl")

from rlfleet.envs.metaworld.env import (  # noqa: E402  (after MUJOCO_GL)
    ALL_TASKS,
    DIFFICULTY,
    TASK_DESCRIPTIONS,
    TASK_SETS,
    MetaWorldEnv,
    resolve_tasks,
)

__all__ = ["ALL_TASKS", "DIFFICULTY", "TASK_DESCRIPTIONS", "TASK_SETS", "MetaWorldEnv", "resolve_tasks"]
