"""MetaWorld MT50's difficulty groups (rlfleet.envs.metaworld.difficulty) against the env's task list."""

from __future__ import annotations

import math

from rlfleet.envs.metaworld import TASK_SETS
from rlfleet.envs.metaworld.difficulty import DIFFICULTY_GROUPS, GROUP_TITLES, group_average, group_means
from rlfleet.envs.registry import task_groups


def test_the_four_groups_partition_mt50_exactly():
    mt50 = TASK_SETS["MT50"]
    assert len(mt50) == 50 and len(set(mt50)) == 50
    members = [t for tasks in DIFFICULTY_GROUPS.values() for t in tasks]
    assert len(members) == len(set(members)) == 50  # no task in two groups
    assert set(members) == set(mt50)  # none missing, none outside MT50
    assert {g: len(t) for g, t in DIFFICULTY_GROUPS.items()} == {"easy": 28, "medium": 11, "hard": 6, "very_hard": 5}
    assert list(GROUP_TITLES.values()) == ["Easy", "Medium", "Hard", "Very Hard"]
    # ML45's held-out five, as MetaWorld v3 splits them, fall in three of the groups
    held_out = set(TASK_SETS["ML45_test"])
    assert held_out == {"bin-picking-v3", "box-close-v3", "hand-insert-v3", "door-lock-v3", "door-unlock-v3"}


def test_the_env_reports_by_the_same_groups():
    groups = task_groups("metaworld")
    for key, title in GROUP_TITLES.items():
        assert groups[title] == list(DIFFICULTY_GROUPS[key])


def test_group_means_and_rlinfs_average_of_groups():
    success = {t: 1.0 for t in DIFFICULTY_GROUPS["easy"]} | {t: 0.0 for t in DIFFICULTY_GROUPS["very_hard"]}
    success["push-v3"] = 0.5  # the only hard task given
    means = group_means(success)
    assert means == {"easy": 1.0, "hard": 0.5, "very_hard": 0.0}  # medium: none given, left out
    assert group_average(means) == 0.5  # each group weighs the same, not each task
    assert group_means(success, tasks={"push-v3"}) == {"hard": 0.5}
    assert math.isnan(group_average({}))
    # RLinf's published pi0 row: its Avg. is the mean of its four group means
    assert round(group_average({"easy": 77.9, "medium": 51.8, "hard": 53.3, "very_hard": 20.0}), 1) == 50.8
