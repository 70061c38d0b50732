"""The training bar runs on time when the wall clock bounds the run, with an ETA."""

from __future__ import annotations

import io

from rich.console import Console

from rlfleet.learner.metrics import TrainProgress


def test_wall_clock_run_progresses_on_time():
    bar = TrainProgress(100_000_000, max_wall_seconds=1800)
    assert bar.fraction(230_400, elapsed=900) == 0.5  # not 0.2% of an unreachable step budget
    bar.steps0 = 0
    assert bar.eta_seconds(230_400, elapsed=900) == 900  # the step budget is far: the clock decides


def test_step_budget_that_comes_first_decides():
    bar = TrainProgress(1000, max_wall_seconds=1800)
    bar.steps0 = 0
    assert bar.fraction(800, elapsed=90) == 0.8
    assert bar.eta_seconds(800, elapsed=80) == 20  # 10 steps/s, 200 steps left


def test_step_bounded_run_and_rendering():
    out = io.StringIO()
    bar = TrainProgress(1000, console=Console(file=out, width=160, force_terminal=False))
    with bar:
        bar.update(250, info="v3 success 0.50")
    assert bar.fraction(250, elapsed=1e6) == 0.25  # no wall budget: steps only
    text = out.getvalue()
    assert "250/1,000 steps" in text and "v3 success 0.50" in text and "25%" in text
