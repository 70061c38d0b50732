"""A run's summary: `summary.json` (written once, by `write_summary`, at the end of the training
loop or of an evaluation-only run) and its lines on the terminal.

The fields: the training loop's own counters (updates, env steps, throughput, checkpoint, ...),
then the evaluation service's (`rlfleet.eval.service`): `eval_success`, `eval_success_mean`,
`eval_split`, `eval_mean_return`, `eval_chain` (the final evaluation), `eval_before`,
`eval_before_mean`, `eval_chain_before` (the starting policy's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlfleet.eval.report import atomic_write

SUMMARY_FILE = "summary.json"


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> Path:
    """`<run_dir>/summary.json`, atomically (a reader never sees half of it); returns its path."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SUMMARY_FILE
    atomic_write(path, json.dumps(summary, indent=2))
    return path


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary a run wrote, None when it wrote none."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else None


def mean_returns(returns: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """An evaluation's mean episode return per task (tasks that ran no episode left out): how envs
    without a success signal (gymnasium's MuJoCo tasks) are judged."""
    return {task: sum(r) / len(r) for task, r in returns.items() if r}


def return_line(mean_return: Mapping[str, float]) -> str:
    """The terminal line for an evaluation's mean episode return per task."""
    return "mean episode return: " + ", ".join(f"{t} {v:.1f}" for t, v in mean_return.items())


def print_summary(summary: Mapping[str, Any]) -> None:
    """A run's end on the terminal: the final evaluation per task, then its counters."""
    console = Console()
    table = Table(title="evaluation (success_once, deterministic policy)")
    table.add_column("task")
    table.add_column("success", justify="right")
    for task, rate in (summary.get("eval_success") or {}).items():
        table.add_row(task, f"{rate:.0%}")
    if summary.get("eval_success"):
        table.add_row("[bold]mean[/bold]", f"[bold]{summary['eval_success_mean']:.0%}[/bold]")
        console.print(table)
    if summary.get("eval_mean_return"):  # envs judged by return (gymnasium's MuJoCo tasks) show it too
        console.print(return_line(summary["eval_mean_return"]))
    keys = ("env_steps", "trained_share", "updates", "train_seconds", "throughput_env_steps_per_s", "checkpoint")
    console.print({k: summary[k] for k in keys if k in summary})
