"""MetaWorld's task tables: task sets, instructions and the difficulty split used in reports."""

from __future__ import annotations

import os
import warnings

# Offscreen rendering without a display: EGL works on CPU through Mesa's llvmpipe. Must be set
# before mujoco is first imported (metaworld imports it).
os.environ.setdefault("MUJOCO_GL", "egl")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import metaworld  # noqa: F401  (registers Meta-World/* gym ids; imports every task module)
    import metaworld.env_dict as _env_dict

from rlfleet.envs.metaworld.difficulty import DIFFICULTY, DIFFICULTY_GROUPS, GROUP_TITLES  # noqa: F401  (DIFFICULTY: re-exported)

TASK_SETS: dict[str, list[str]] = {
    "MT10": list(_env_dict.MT10_V3),
    "MT25": list(_env_dict.MT25_V3),
    "MT50": list(_env_dict.MT50_V3),
    # ML45: train on 45 tasks, evaluate on the 5 held out (as MetaWorld's own split)
    "ML45_train": list(_env_dict.ML45_V3["train"]),
    "ML45_test": list(_env_dict.ML45_V3["test"]),
}
ALL_TASKS: list[str] = list(_env_dict.ALL_V3_ENVIRONMENTS)

TASK_DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "pick up the nut and place it onto the peg",
    "basketball-v3": "pick up the basketball and dunk it into the basket",
    "bin-picking-v3": "pick up the puck from one bin and place it into the other bin",
    "box-close-v3": "pick up the box lid and close the box with it",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "bypass the wall and press the button from the top",
    "button-press-v3": "press the button",
    "button-press-wall-v3": "bypass the wall and press the button",
    "coffee-button-v3": "push the button on the coffee machine",
    "coffee-pull-v3": "pull the mug out from under the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "rotate the dial 180 degrees",
    "disassemble-v3": "pick the nut off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door by rotating the lock clockwise",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door by rotating the lock counter-clockwise",
    "hand-insert-v3": "insert the gripper into the hole",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-open-v3": "rotate the faucet handle counter-clockwise",
    "faucet-close-v3": "rotate the faucet handle clockwise",
    "hammer-v3": "pick up the hammer and hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down sideways",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up sideways",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up 90 degrees",
    "pick-place-wall-v3": "pick up the puck, bypass the wall and place it at the goal",
    "pick-out-of-hole-v3": "pick the puck up out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the cabinet",
    "plate-slide-side-v3": "slide the plate into the cabinet sideways",
    "plate-slide-back-v3": "slide the plate out of the cabinet",
    "plate-slide-back-side-v3": "slide the plate out of the cabinet sideways",
    "peg-insert-side-v3": "pick up the peg and insert it sideways into the hole",
    "peg-unplug-side-v3": "unplug the peg sideways",
    "soccer-v3": "push the soccer ball into the goal",
    "stick-push-v3": "pick up the stick and push the box with it",
    "stick-pull-v3": "pick up the stick and pull the box with it",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "bypass the wall and push the puck to the goal",
    "push-back-v3": "push the puck back to the goal",
    "reach-v3": "reach the goal position",
    "reach-wall-v3": "bypass the wall and reach the goal position",
    "shelf-place-v3": "pick up the puck and place it onto the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "push the window open",
    "window-close-v3": "push the window closed",
}

# Tasks scored at the fingertips (`tcp_center` within 5 cm of the goal) whose MetaWorld expert
# steers the hand body, about 4.5 cm above the fingertips, onto the goal: its demos end on the
# rim of the success ball, where a policy imitating them a few cm off fails. Their expert aims
# the fingertips at the goal instead (MetaWorldEnv.expert_one).
FINGERTIP_GOAL_TASKS: frozenset[str] = frozenset({"reach-v3", "reach-wall-v3"})


def resolve_tasks(task: str) -> list[str]:
    """Expand `EnvConfig.task` (a task, MT10/MT25/MT50, or "a-v3,b-v3") into the env's task list.

    `obs["task_ids"]` index into this list; it depends only on the string, so every worker
    process of a run agrees on it.
    """
    if task in TASK_SETS:
        return list(TASK_SETS[task])
    if not task.strip():
        raise ValueError(
            f"env.task is empty: name a MetaWorld task (e.g. reach-v3), a task set ({', '.join(TASK_SETS)}) "
            "or a comma-separated list"
        )
    names = [t.strip() for t in task.split(",") if t.strip()]
    unknown = [t for t in names if t not in _env_dict.ALL_V3_ENVIRONMENTS]
    if not names or unknown:
        raise ValueError(
            f"unknown MetaWorld task(s) {unknown or [task]}; use a task set ({', '.join(TASK_SETS)}), "
            f"a comma-separated list, or any of: {', '.join(sorted(ALL_TASKS))}"
        )
    return names


def task_groups() -> dict[str, list[str]]:
    """Groups the evaluation report averages over: the difficulty split of Seo et al. (2022), as
    TinyVLA, SmolVLA and RLinf report it, and ML45's 5 held-out tasks."""
    groups = {GROUP_TITLES[level]: list(tasks) for level, tasks in DIFFICULTY_GROUPS.items()}
    groups["ML45 held-out"] = list(TASK_SETS["ML45_test"])
    return groups
