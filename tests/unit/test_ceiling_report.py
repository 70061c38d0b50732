"""bench/ceiling.py's arithmetic on synthetic readings: histogram deltas and quantiles, the
one-factor sweep, saturation, the cluster extrapolation and the generated page."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("ceiling", Path(__file__).resolve().parents[2] / "bench" / "ceiling.py")
ceiling = importlib.util.module_from_spec(_spec)
sys.modules["ceiling"] = ceiling  # dataclasses look their module up by name
_spec.loader.exec_module(ceiling)


def _reading(at: float, buckets: dict[str, float], name: str = "h") -> object:
    samples = {(f"{name}_bucket", (("le", le),)): v for le, v in buckets.items()}
    return ceiling.Reading(at, samples)


def test_histogram_delta_and_quantile_interpolate_inside_buckets():
    a = _reading(0.0, {"1.0": 5, "2.0": 5, "4.0": 5, "+Inf": 5})
    b = _reading(1.0, {"1.0": 5, "2.0": 15, "4.0": 25, "+Inf": 25})
    delta = ceiling.histogram_delta(a, b, "h")
    assert delta == [(1.0, 0.0), (2.0, 10.0), (4.0, 10.0), (math.inf, 0.0)]
    assert ceiling.histogram_quantile(0.5, delta) == pytest.approx(2.0)  # 10th of 20: top of (1, 2]
    assert ceiling.histogram_quantile(0.75, delta) == pytest.approx(3.0)  # halfway through (2, 4]
    assert math.isnan(ceiling.histogram_quantile(0.5, [(1.0, 0.0)]))
    assert ceiling.histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 9.0)]) == 1.0  # past the last edge


def test_one_factor_at_a_time_around_the_base():
    base = ceiling.Point()
    points = ceiling.sweep_points(base, {"actors": [1, 2, 4], "transport": ["shm", "zmq"]})
    assert [f for f, _ in points] == ["base", "actors", "actors", "transport"]
    assert points[0][1] == base and points[-1][1] == ceiling.Point(transport="zmq")
    assert all(sum(getattr(p, k) != getattr(base, k) for k in vars(base)) <= 1 for _, p in points)


def _result(point, mode: str, rate: float, us: dict[str, float], busy: float = 0.5, batch: float = 8.0) -> dict:
    from dataclasses import asdict

    return {
        "point": asdict(point),
        "mode": mode,
        "error": None,
        "env_steps_per_s": rate,
        "cpu_us_per_env_step": us,
        "cpu_cores": {k: v * rate / 1e6 for k, v in us.items()},
        "inference": {
            "mean_batch": batch,
            "busy_fraction": busy,
            "latency_p50_ms": 1.0,
            "latency_p99_ms": 5.0,
            "batch_size_distribution": {"8.0": 1.0},
        },
        "learner": {"segments_per_s": rate / 512, "queue_full_fraction": 0.0},
    }


US = {"actor": 40.0, "env_workers": 40.0, "inference": 100.0, "learner_ingest": 20.0, "learner_loop": 5.0}


def test_saturation_extrapolation_and_page(tmp_path):
    base = ceiling.Point()
    results = [
        _result(ceiling.Point(actors=n), "sampling", rate, dict(US, inference=100.0 / n), batch=8.0 * n)
        for n, rate in ((1, 4000.0), (2, 7000.0), (4, 7300.0))
    ]
    results.append(_result(base, "training", 3500.0, dict(US, learner_loop=75.0)))
    sat = ceiling.saturation(results, base, "sampling")
    assert sat["actors_at_knee"] == 2 and sat["saturation_env_steps_per_s"] == 7300.0
    settings = ceiling.Settings("metaworld_reach_ppo", 39, 4, 1, 150, 0, 1.0, 1.0, 60.0)
    ex = ceiling.extrapolate(results, base, settings, host_cores=32, nic_gbit=25.0, sim_us=320.0)
    assert ex["inference_us_per_env_step"] == 25.0  # the best-batched point, 4 actors
    assert ex["inference_capacity_env_steps_per_s"] == pytest.approx(40_000)
    assert ex["learner_ingest_capacity_env_steps_per_s"] == pytest.approx(1e6 / 25)
    assert ex["learner_training_capacity_env_steps_per_s"] == pytest.approx(1e6 / 95)
    zero, real = ex["sims"]["zero-cost env"], ex["sims"]["real simulator"]
    assert zero["actor_host_env_steps_per_s"] == pytest.approx(32e6 / 80)
    assert real["actor_host_env_steps_per_s"] == pytest.approx(32e6 / 400)
    assert zero["first_bottleneck"] == "learner (training)"  # 10.5k < 40k inference < NIC
    assert zero["at"]["100"]["inference_servers"] == math.ceil(100 * 1e6 / 95 / 40_000)
    args = argparse.Namespace(out=tmp_path, host_cores=32, nic_gbit=25.0, no_doc=True)
    report = {
        "meta": {
            "date": "d",
            "machine": "m",
            "cpus": 2,
            "load_at_start": "0.0",
            "commit": "c",
            "command": "python bench/ceiling.py",
            "label": "SYNTHETIC",
            "base": vars(base),
            "settings": {k: v for k, v in vars(settings).items() if k != "extra"},
            "sim_us_per_env_step": 320.0,
        },
        "sweep": {"actors": [1, 2, 4]},
        "points": [
            ["base", vars(base)],
            ["actors", vars(ceiling.Point(actors=2))],
            ["actors", vars(ceiling.Point(actors=4))],
        ],
        "results": results,
    }
    ceiling.write_report(report, args, settings)
    page = (tmp_path / "ceiling.md").read_text()
    assert "SYNTHETIC" in page and "| base | 1a x 16e, shm, state, mb 256 | 4,000 | 3,500 | 0.88 |" in page
    assert "learner (training)" in page and (tmp_path / "ceiling_sweep.png").exists()


def test_the_doc_section_between_the_markers_is_replaced(tmp_path):
    doc = tmp_path / "performance.md"
    doc.write_text(f"# P\n\nintro\n\n{ceiling.DOC_BEGIN}\nold\n{ceiling.DOC_END}\n\nafter\n")
    assert ceiling.update_doc(doc, "new table\n")
    assert doc.read_text() == f"# P\n\nintro\n\n{ceiling.DOC_BEGIN}\nnew table\n{ceiling.DOC_END}\n\nafter\n"
    assert not ceiling.update_doc(tmp_path / "missing.md", "x")


def test_the_shape_factor_moves_actors_and_envs_together():
    base = ceiling.Point()
    points = ceiling.sweep_points(base, {"shape": ["1x128", "8x16", "32x4"], "envs": [16, 1024]})
    assert [p for _, p in points][1:4] == [
        ceiling.Point(actors=1, envs=128),
        ceiling.Point(actors=8, envs=16),
        ceiling.Point(actors=32, envs=4),
    ]
    assert points[-1] == ("envs", ceiling.Point(envs=1024))
    results = [_result(p, "training", 1000.0 * (i + 1), US) for i, (_, p) in enumerate(points)]
    series = ceiling.factor_series(results, base, "shape", "training")
    assert [v for v, _ in series] == ["1x16", "1x128", "8x16", "32x4"]  # the base point is 1 x 16
    assert {"envs", "shape"} <= set(ceiling.FULL_SWEEP) and 1024 in ceiling.FULL_SWEEP["envs"]


def _readings(at: float, **counters: float) -> object:
    """A learner reading: plain counters, and `lagK=n` as the policy lag rows of lag K."""
    samples = {(k, ()): v for k, v in counters.items() if not k.startswith("lag")}
    lag = "rlfleet_learner_policy_lag_rows_total"
    samples.update({(lag, (("lag", k[3:]),)): v for k, v in counters.items() if k.startswith("lag")})
    return ceiling.Reading(at, samples)


def test_training_records_the_trained_of_updated_share_the_lag_and_the_cost_per_trained_step():
    zero = {"rlfleet_actor_env_steps_total": 0.0, "process_cpu_seconds_total": 0.0}
    a = {
        "actor0": ceiling.Reading(0.0, {(k, ()): v for k, v in zero.items()}),
        "learner": _readings(0.0, lag0=100, lag1=0),
        "inference": ceiling.Reading(0.0, {}),
    }
    b = {
        "actor0": ceiling.Reading(
            10.0, {("rlfleet_actor_env_steps_total", ()): 10_000.0, ("process_cpu_seconds_total", ()): 1.0}
        ),
        "learner": _readings(
            10.0,
            rlfleet_learner_trained_env_steps_total=8_000,
            rlfleet_learner_masked_env_steps_total=2_000,
            rlfleet_learner_credit_waits_total=3,
            lag0=800,
            lag1=200,
            lag3=100,
        ),
        "inference": ceiling.Reading(10.0, {}),
    }
    r = ceiling.summarise(a, b, [0.0], 0)
    assert r["trained_env_steps_per_s"] == 800.0 and r["masked_env_steps_per_s"] == 200.0
    assert r["trained_of_updated"] == 0.8 and r["credit_waits"] == 3
    assert r["policy_lag"]["distribution"] == pytest.approx({"0": 0.7, "1": 0.2, "3": 0.1})  # rows in the window
    assert r["policy_lag"]["max"] == 3 and r["policy_lag"]["mean"] == pytest.approx((200 + 300) / 1000)
    assert r["cpu_us_per_trained_env_step"]["actor"] == pytest.approx(1e6 / 8_000)
    assert r["cpu_us_per_env_step"]["actor"] == pytest.approx(1e6 / 10_000)


def test_median_run_keeps_one_whole_run_and_every_repeats_rate() -> None:
    runs = [
        {"env_steps_per_s": 300.0, "error": None, "cpu": 3},
        {"env_steps_per_s": 100.0, "error": None, "cpu": 1},
        {"error": "fleet did not start"},
        {"env_steps_per_s": 200.0, "error": None, "cpu": 2},
    ]
    kept = ceiling.median_run(runs)
    assert (kept["env_steps_per_s"], kept["cpu"]) == (200.0, 2)
    assert kept["repeats_env_steps_per_s"] == [300.0, 100.0, None, 200.0]
    assert kept["repeats_failed"] == 1
    assert ceiling.median_run([{"error": "a"}, {"error": "b"}]) == {"error": "b"}


def test_compare_sets_each_point_beside_the_earlier_one() -> None:
    def run(mode: str, rate: float, us: float, share: float = 1.0) -> dict:
        r = {
            "point": {"actors": 1, "envs": 16, "transport": "shm", "obs": "state", "max_batch": 256},
            "mode": mode,
            "error": None,
            "env_steps_per_s": rate,
            "cpu_us_per_env_step": {"actor": us / 2, "inference": us / 2},
            "cpu_cores": {"actor": 0.5, "inference": 0.25},
        }
        if mode == "training":
            r |= {"trained_env_steps_per_s": rate, "cpu_us_per_trained_env_step": {"a": us}}
            r["trained_of_updated"] = share
        return r

    meta = {"commit": "abc", "date": "d", "machine": "m", "cpus": 2}
    before = {"meta": meta, "results": [run("sampling", 100.0, 50.0), run("training", 80.0, 60.0, 0.9)]}
    after = {"meta": meta, "results": [run("sampling", 200.0, 25.0), run("training", 160.0, 30.0)]}
    text = ceiling.compare(before, after)
    assert "| 1a x 16e, shm, state, mb 256 | sampling | 100 | 200 | 2.00 | 50.0 | 25.0 | 0.50 | – | 0.75 / 0.75 |" in (
        text
    )
    assert "| training | 80 | 160 | 2.00 | 60.0 | 30.0 | 0.50 | 90.0 % / 100.0 % |" in text
