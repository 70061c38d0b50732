"""CALVIN's long-horizon metrics for envs whose episode is a chain of instructions (the math; the
learner scores training episodes with it, `rlfleet.eval.report.chain_markdown` renders the table).

An episode of such an env (`rlfleet.envs.calvin`) is a chain of `chain_length` subtasks that ends
at the first failure; its sparse return is the number of subtasks completed in a row. CALVIN
(Mees et al. 2022) and RLinf's CALVIN table report:

    success_len_k   = fraction of chains whose first k subtasks all succeeded (k = 1..chain_length)
    avg_num_subtasks = mean number completed in a row = sum_k success_len_k
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

CHAIN_LENGTH = 5  # CALVIN's evaluation chains


def chain_metrics(completed: Sequence[int] | np.ndarray, chain_length: int = CHAIN_LENGTH) -> dict[str, float]:
    """avg_num_subtasks and success_len_1..chain_length over finished chains."""
    done = np.asarray(completed, dtype=np.int64)
    if done.size == 0:
        raise ValueError("no finished chains to score")
    if (done < 0).any() or (done > chain_length).any():
        raise ValueError(f"completed subtasks must be in [0, {chain_length}], got {done.min()}..{done.max()}")
    out = {"avg_num_subtasks": float(done.mean())}
    for k in range(1, chain_length + 1):
        out[f"success_len_{k}"] = float((done >= k).mean())
    return out


def chain_report(
    returns_by_task: Mapping[str, Sequence[float]], chain_length: int = CHAIN_LENGTH
) -> dict[str, dict[str, float]]:
    """Chain metrics per task (scene variant) and over all episodes ("all"), from sparse returns."""

    def done(rets: Sequence[float]) -> np.ndarray:
        return np.clip(np.rint(np.asarray(rets, np.float64)), 0, chain_length).astype(np.int64)

    out = {task: chain_metrics(done(r), chain_length) for task, r in returns_by_task.items()}
    out["all"] = chain_metrics(np.concatenate([done(r) for r in returns_by_task.values()]), chain_length)
    return out


def chain_columns(chain_length: int = CHAIN_LENGTH) -> list[str]:
    return [f"success_len_{k}" for k in range(1, chain_length + 1)] + ["avg_num_subtasks"]
