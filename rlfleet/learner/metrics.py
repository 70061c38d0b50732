"""Metrics: scalars with RLinf's names (to TensorBoard and the other trackers), episode aggregation
and a rich progress line."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlfleet.config import as_dict
from rlfleet.envs.chains import chain_metrics
from rlfleet.telemetry.trackers import Backend, MetricsLogger, TensorBoardBackend, logger_backends, make_backends
from rlfleet.wire.segment import Segment

MAX_TASK_SERIES = 256  # per-task series when the env names no tasks (the ids an actor reports are not trusted)


class EpisodeWindow:
    """The last N finished episodes (overall and per task) for env/* metrics.

    Per-task series exist only for task ids the env has (0..len(task_names)-1, or the first
    MAX_TASK_SERIES ids when it names none): a segment's ids come from the network, and each
    id would otherwise become a Prometheus series and a TensorBoard tag. Episodes with other
    ids still count overall and in `unknown_task_episodes`.
    """

    def __init__(self, task_names: list[str], size: int = 200, chain_length: int = 0):
        self.task_names = task_names
        self.chain_length = chain_length  # > 0: returns count subtasks in a row (CALVIN metrics)
        self.recent: deque[tuple[float, int, bool, int]] = deque(maxlen=size)
        self.per_task: dict[int, deque[bool]] = {}
        self.unknown_task_episodes = 0

    def _known(self, task: int) -> bool:
        if self.task_names:
            return 0 <= task < len(self.task_names)
        return 0 <= task and (task in self.per_task or len(self.per_task) < MAX_TASK_SERIES)

    def add(self, seg: Segment) -> None:
        for ret, length, ok, task in zip(seg.ep_returns, seg.ep_lengths, seg.ep_success, seg.ep_task_ids):
            self.recent.append((float(ret), int(length), bool(ok), int(task)))
            if self._known(int(task)):
                self.per_task.setdefault(int(task), deque(maxlen=50)).append(bool(ok))
            else:
                self.unknown_task_episodes += 1

    def scalars(self) -> dict[str, float]:
        if not self.recent:
            return {}
        arr = np.array([(ret, length, s) for ret, length, s, _ in self.recent], dtype=np.float64)
        out = {
            "env/return": arr[:, 0].mean(),
            "env/episode_len": arr[:, 1].mean(),
            "env/success_once": arr[:, 2].mean(),
        }
        if self.chain_length:
            done = np.clip(np.rint(arr[:, 0]), 0, self.chain_length).astype(np.int64)
            out.update({f"env/{k}": v for k, v in chain_metrics(done, self.chain_length).items()})
        if len(self.per_task) > 1:
            for task, oks in self.per_task.items():
                name = self.task_names[task] if task < len(self.task_names) else str(task)
                out[f"env/success_once/{name}"] = float(np.mean(oks))
        if self.unknown_task_episodes:
            out["env/unknown_task_episodes"] = float(self.unknown_task_episodes)
        return out


LAG_COUNT_PREFIX = "throughput/policy_lag_count/"


def policy_lag_counts(lags: np.ndarray, max_policy_lag: int) -> dict[str, float]:
    """Samples per policy lag, ``throughput/policy_lag_count/<lag>``: every lag 0..max_policy_lag
    (zeros included, so the curves are continuous) plus any larger lag seen (dropped samples)."""
    lags = np.asarray(lags, np.int64)
    counts = np.bincount(lags, minlength=max_policy_lag + 1) if lags.size else np.zeros(max_policy_lag + 1, np.int64)
    return {f"{LAG_COUNT_PREFIX}{k}": float(c) for k, c in enumerate(counts) if k <= max_policy_lag or c}


class MetricsWriter(MetricsLogger):
    """The run's metrics: TensorBoard (RUN/tensorboard) and every other tracker named in
    `runner.logger.logger_backends` (rlfleet.telemetry.trackers), through one object."""

    def __init__(self, log_dir: Path, enabled: bool = True, backends: Mapping[str, Backend] | None = None):
        if backends is None:
            backends = {"tensorboard": TensorBoardBackend(log_dir)} if enabled else {}
        super().__init__(backends)

    @classmethod
    def for_run(cls, cfg: Any, run_dir: Path) -> MetricsWriter:
        """The backends of `cfg.runner.logger`; the tracker run is named after runner.experiment_name."""
        logger = cfg.runner.logger
        backends = make_backends(
            logger_backends(logger),
            Path(run_dir),
            str(logger.get("project_name", "rlfleet")),
            str(cfg.runner.experiment_name),
            config=as_dict(cfg),
        )
        return cls(Path(run_dir) / "tensorboard", backends=backends)

    def write(self, scalars: Mapping[str, float | None], step: int) -> None:
        self.scalars(scalars, step)

    def write_lag_histogram(self, scalars: dict[str, float], step: int) -> None:
        """TensorBoard histogram ``throughput/policy_lag_hist`` rebuilt from the per-lag counts in
        ``scalars`` (see :func:`policy_lag_counts`): one integer-wide bin per lag."""
        counts = {int(k[len(LAG_COUNT_PREFIX) :]): int(v) for k, v in scalars.items() if k.startswith(LAG_COUNT_PREFIX)}
        if not any(counts.values()):
            return
        lags = np.repeat(np.fromiter(counts.keys(), np.int64), np.fromiter(counts.values(), np.int64))
        self.histogram("throughput/policy_lag_hist", lags, step, bins=np.arange(-0.5, max(counts) + 1.0))


class TrainProgress:
    """The training bar: on env steps, or on time when the run is bounded by the wall clock.

    A run with `runner.max_wall_seconds` ends on whichever budget runs out first, so the bar shows
    the larger of the two fractions and an ETA from it (a 100M-step budget a 30-minute run never
    reaches would otherwise stop the bar at a fraction of a percent)."""

    def __init__(self, total_env_steps: int, max_wall_seconds: float = 0.0, console=None):
        self.total_env_steps, self.max_wall_seconds = int(total_env_steps), float(max_wall_seconds)
        self.progress = Progress(
            TextColumn("[bold]train[/bold]"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.fields[steps]}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            transient=False,
            console=console,
        )
        self.task = self.progress.add_task("train", total=1.0, steps="", info="waiting for actors", eta="-")
        self.t0 = time.monotonic()
        self.steps0: int | None = None  # steps when counting started (a resumed run starts above 0)

    def fraction(self, env_steps: int, elapsed: float) -> float:
        frac = env_steps / self.total_env_steps if self.total_env_steps > 0 else 0.0
        if self.max_wall_seconds > 0:
            frac = max(frac, elapsed / self.max_wall_seconds)
        return min(frac, 1.0)

    def eta_seconds(self, env_steps: int, elapsed: float) -> float | None:
        """Seconds left: the wall budget's remainder, or sooner if the step rate reaches the step budget first."""
        left = [self.max_wall_seconds - elapsed] if self.max_wall_seconds > 0 else []
        done = env_steps - (self.steps0 or 0)
        if done > 0 and elapsed > 0:
            left.append((self.total_env_steps - env_steps) / (done / elapsed))
        return max(0.0, min(left)) if left else None

    def update(self, env_steps: int, info: str | None = None) -> None:
        if self.steps0 is None:
            self.steps0 = env_steps
        elapsed = time.monotonic() - self.t0
        eta = self.eta_seconds(env_steps, elapsed)
        steps = f"{env_steps:,} steps" if self.max_wall_seconds > 0 else f"{env_steps:,}/{self.total_env_steps:,} steps"
        fields: dict[str, Any] = {
            "steps": steps,
            "eta": "-" if eta is None else time.strftime("%H:%M:%S", time.gmtime(eta)),
        }
        if info is not None:
            fields["info"] = info
        self.progress.update(self.task, completed=self.fraction(env_steps, elapsed), **fields)

    def __enter__(self) -> TrainProgress:
        self.t0 = time.monotonic()
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)


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
