"""bench/throughput.py's split of a fleet ratio into CPU cost and busy cores, on synthetic readings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "throughput", Path(__file__).resolve().parents[2] / "bench" / "throughput.py"
)
throughput = importlib.util.module_from_spec(_spec)
sys.modules["throughput"] = throughput
_spec.loader.exec_module(throughput)


def _fleet_us(env: float, actor: float, inference: float, learner: float) -> dict:
    return {
        "env workers": env,
        "actor": actor,
        "inference": inference,
        "learner": learner,
        "total": env + actor + inference + learner,
    }


def test_ratio_is_cpu_cost_times_busy_cores_for_every_repeat():
    # bare: 2 busy cores at 300 us per step -> 6,667 steps/s; the fleet costs 400 us per step and
    # keeps 1.8 cores busy -> 4,500 steps/s: ratio 0.675 = (300 / 400) x (1.8 / 2.0)
    bare_rates, bare_us = [2e6 / 300] * 3, [300.0] * 3
    fleet_us = [_fleet_us(330, 20, 40, 10)] * 3
    rates = [1.8e6 / 400] * 3
    why = throughput.decompose(bare_rates, bare_us, rates, fleet_us)
    assert why["cpu_cost"] == pytest.approx(0.75)
    assert why["busy"] == pytest.approx(0.9)
    assert why["cpu_cost"] * why["busy"] == pytest.approx(rates[0] / bare_rates[0])
    assert why["bare_busy_cores"] == pytest.approx(2.0)
    assert why["extra_us"] == pytest.approx({"env workers": 30, "actor": 20, "inference": 40, "learner": 10})


def test_medians_are_taken_over_repeats():
    bare_rates, bare_us = [1000.0, 1000.0, 1000.0], [2000.0, 2000.0, 2000.0]
    fleet_us = [_fleet_us(2000, 0, 0, v) for v in (0.0, 500.0, 2000.0)]
    rates = [1000.0, 800.0, 500.0]  # every repeat keeps the cores exactly as busy as the bare loop
    why = throughput.decompose(bare_rates, bare_us, rates, fleet_us)
    assert why["busy"] == pytest.approx(1.0)
    assert why["cpu_cost"] == pytest.approx(0.8)  # median of 1.0, 0.8, 0.5
    assert why["extra_us"]["learner"] == pytest.approx(500.0)


def test_report_adds_the_split_to_an_earlier_json(tmp_path, capsys):
    part = {
        "recipe": "metaworld_reach_ppo",
        "env_steps_per_s": {"bare": [2000.0], "sampling": [1500.0], "training": [1000.0]},
        "cpu_us_per_env_step": {
            "bare": [1000.0],
            "sampling": [_fleet_us(1100, 100, 100, 20)],
            "training": [_fleet_us(1100, 100, 100, 700)],
        },
        "sampling/bare": 0.75,
        "training/bare": 0.5,
        "worker_cpu_per_step_sampling/bare": 1.1,
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"date": "d", "machine": "m", "state": part}))
    assert throughput.report(path) == 0
    out = capsys.readouterr().out
    assert "sampling = CPU cost 0.76 x busy 0.99" in out  # 1000 / 1320; 1320 x 1500 / (1000 x 2000)
    assert "learner +700" in out


def test_each_repeat_reaches_the_caller_so_a_cut_run_keeps_it(monkeypatch):
    """The bench writes its JSON after every repeat (a run stopped in its third repeat kept none)."""
    monkeypatch.setattr(throughput, "bare_loop", lambda cfg, seconds: (1000.0, 2000.0))
    monkeypatch.setattr(
        throughput,
        "fleet",
        lambda recipe, overrides, seconds, warmup, consume_only: {
            "env_steps_per_s_wall": 900.0 if consume_only else 600.0,
            "us_per_env_step": _fleet_us(2100, 50, 50, 0 if consume_only else 1000),
        },
    )
    seen = []
    final = throughput.fleet_part("state", [], 1.0, 0.0, 2, on_repeat=seen.append)
    assert [s["repeats"] for s in seen] == [1, 2]
    assert seen[0]["sampling/bare"] == pytest.approx(0.9) and seen[0]["training/bare"] == pytest.approx(0.6)
    assert final == seen[-1]
