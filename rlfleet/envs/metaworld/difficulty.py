"""MetaWorld MT50's difficulty groups: Easy / Medium / Hard / Very Hard.

The split of Seo et al., "Masked World Models for Visual Control" (CoRL 2022), as TinyVLA,
SmolVLA, LeRobot (`lerobot/envs/metaworld_config.json`, DIFFICULTY_TO_TASKS:
https://github.com/huggingface/lerobot/blob/main/src/lerobot/envs/metaworld_config.json) and
RLinf's MetaWorld table (https://rlinf.readthedocs.io/en/latest/rst_source/examples/embodied/metaworld.html)
report MT50 by: 28 easy, 11 medium, 6 hard and 5 very hard tasks, every MT50 task in exactly one.
RLinf's "Avg." column is the mean of the four group means (pi0: (77.9 + 51.8 + 53.3 + 20.0) / 4 =
50.8), not the mean over the 50 tasks; `group_average` computes it the same way.

Plain data, no simulator import: reports and bench scripts read it without MuJoCo.
"""

from __future__ import annotations

from collections.abc import Mapping

# Task names as MetaWorld v3 names them (rlfleet.envs.metaworld.tasks.TASK_SETS["MT50"]).
DIFFICULTY_GROUPS: dict[str, tuple[str, ...]] = {
    "easy": (
        "button-press-v3", "button-press-topdown-v3", "button-press-topdown-wall-v3",
        "button-press-wall-v3", "coffee-button-v3", "dial-turn-v3", "door-close-v3",
        "door-lock-v3", "door-open-v3", "door-unlock-v3", "drawer-close-v3", "drawer-open-v3",
        "faucet-close-v3", "faucet-open-v3", "handle-press-v3", "handle-press-side-v3",
        "handle-pull-v3", "handle-pull-side-v3", "lever-pull-v3", "plate-slide-v3",
        "plate-slide-back-v3", "plate-slide-back-side-v3", "plate-slide-side-v3", "reach-v3",
        "reach-wall-v3", "window-close-v3", "window-open-v3", "peg-unplug-side-v3",
    ),
    "medium": (
        "basketball-v3", "bin-picking-v3", "box-close-v3", "coffee-pull-v3", "coffee-push-v3",
        "hammer-v3", "peg-insert-side-v3", "push-wall-v3", "soccer-v3", "sweep-v3", "sweep-into-v3",
    ),
    "hard": (
        "assembly-v3", "hand-insert-v3", "pick-out-of-hole-v3", "pick-place-v3", "push-v3", "push-back-v3",
    ),
    "very_hard": (
        "shelf-place-v3", "disassemble-v3", "stick-pull-v3", "stick-push-v3", "pick-place-wall-v3",
    ),
}  # fmt: skip

GROUP_TITLES: dict[str, str] = {"easy": "Easy", "medium": "Medium", "hard": "Hard", "very_hard": "Very Hard"}

DIFFICULTY: dict[str, str] = {task: group for group, tasks in DIFFICULTY_GROUPS.items() for task in tasks}


def group_means(success: Mapping[str, float], tasks: set[str] | None = None) -> dict[str, float]:
    """Mean success per difficulty group over the tasks `success` holds (restricted to `tasks`
    when given, e.g. ML45's 45 training tasks); a group with none of them is left out."""
    out = {}
    for group, members in DIFFICULTY_GROUPS.items():
        values = [float(success[t]) for t in members if t in success and (tasks is None or t in tasks)]
        if values:
            out[group] = sum(values) / len(values)
    return out


def group_average(means: Mapping[str, float]) -> float:
    """RLinf's "Avg.": the mean of the group means (each group weighs the same)."""
    return sum(means.values()) / len(means) if means else float("nan")
