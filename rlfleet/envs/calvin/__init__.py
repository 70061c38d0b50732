"""A CALVIN-style long-horizon playtable on PyBullet (drawer, sliding door, button + LED, switch +
lightbulb, three blocks, a Franka Panda), whose episodes are chains of 5 language-instructed subtasks.

`rlfleet.envs.calvin.env.CalvinEnv` is the `ChunkedEnv` (registered as "calvin"; it imports
pybullet). This package itself only exposes the simulator-free parts: the subtask vocabulary,
the scene variants and the train / eval chain pools. See docs/calvin.md.
"""

from rlfleet.envs.calvin.chains import ChainSpec, build_pool, pool_entry
from rlfleet.envs.calvin.layout import VARIANTS, Variant
from rlfleet.envs.calvin.subtasks import SUBTASK_NAMES, SUBTASKS, Subtask

__all__ = ["SUBTASKS", "SUBTASK_NAMES", "VARIANTS", "ChainSpec", "Subtask", "Variant", "build_pool", "pool_entry"]
