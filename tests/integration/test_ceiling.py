"""bench/ceiling.py end to end: one tiny point of the real fleet (learner, inference server, actors
on loopback, zero-cost env), sampling and training; the report's structure and sanity, no timings."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

CEILING = Path(__file__).resolve().parents[2] / "bench" / "ceiling.py"
ROLES = {"actor", "env_workers", "inference", "learner_ingest", "learner_loop"}


def _positive(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _run_ceiling(*args: str) -> None:
    res = subprocess.run(
        [sys.executable, str(CEILING), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]


def test_a_tiny_ceiling_point_reports_per_role_cpu_and_inference_stats(tmp_path):
    out = tmp_path / "ceiling"
    _run_ceiling(
        *("--factors", "none", "--base", "envs=4,transport=zmq", "--warmup", "0.5", "--seconds", "1.5"),
        *("--sim", "", "--out", str(out), "learner.batch_samples=64", "actor.rollout_len=8"),
    )
    report = json.loads((out / "ceiling.json").read_text())
    assert [r["mode"] for r in report["results"]] == ["sampling", "training"]
    for r in report["results"]:
        assert r["error"] is None and r["point"]["transport"] == "zmq"
        assert _positive(r["env_steps_per_s"])
        us = r["cpu_us_per_env_step"]
        assert set(us) == ROLES and all(math.isfinite(v) and v >= 0 for v in us.values())
        # each process does real work per step; the learner's loop only gathers when it only samples
        assert all(_positive(us[k]) for k in ("actor", "env_workers", "inference", "learner_ingest"))
        assert {"main", "native"} <= set(r["thread_cpu_seconds"]["learner"])  # gRPC core runs native threads
        inf = r["inference"]
        assert _positive(inf["mean_batch"]) and inf["mean_batch"] <= 4  # one stage of 2 of 4 envs: 2 rows
        assert _positive(inf["latency_p50_ms"]) and inf["latency_p50_ms"] <= inf["latency_p99_ms"]
        assert math.isclose(sum(inf["batch_size_distribution"].values()), 1.0, rel_tol=1e-6)
        assert 0 < inf["busy_fraction"] <= 1
        assert _positive(r["learner"]["segments_per_s"]) and _positive(r["learner"]["env_steps_per_s"])
    training = report["results"][1]
    assert _positive(training["cpu_us_per_env_step"]["learner_loop"])  # PPO updates ran in the main loop
    # what the updates trained on, beside what the fleet stepped (paced: the default flow control)
    assert report["meta"]["settings"]["flow_control"] == "pace"
    assert _positive(training["trained_env_steps_per_s"]) and 0 < training["trained_of_updated"] <= 1
    lag = training["policy_lag"]
    assert math.isclose(sum(lag["distribution"].values()), 1.0, rel_tol=1e-6) and lag["max"] >= lag["mean"] >= 0
    assert set(training["cpu_us_per_trained_env_step"]) == ROLES
    assert "What training trained on" in (out / "ceiling.md").read_text()
    ex = report["extrapolation"]
    assert _positive(ex["inference_capacity_env_steps_per_s"]) and "zero-cost env" in ex["sims"]
    page = (out / "ceiling.md").read_text()
    assert "CPU per env step of each role" in page and "Cluster extrapolation" in page
    assert (out / "ceiling_sweep.png").stat().st_size > 0 and (out / "ceiling_cpu.png").stat().st_size > 0


def test_a_point_with_in_process_envs_and_repeats(tmp_path):
    # actor.num_workers=0: the actor steps its envs itself (no env worker processes to measure);
    # --repeat 2 keeps the median run and both rates
    out = tmp_path / "ceiling"
    _run_ceiling(
        *("--factors", "none", "--modes", "training", "--repeat", "2", "--base", "envs=4"),
        *("--warmup", "0.5", "--seconds", "1.5", "--sim", "", "--out", str(out)),
        *("learner.batch_samples=64", "actor.rollout_len=8", "actor.num_workers=0"),
    )
    report = json.loads((out / "ceiling.json").read_text())
    (r,) = report["results"]
    assert r["error"] is None and report["meta"]["repeat"] == 2
    assert len(r["repeats_env_steps_per_s"]) == 2 and r["env_steps_per_s"] in r["repeats_env_steps_per_s"]
    us = r["cpu_us_per_env_step"]
    assert us["env_workers"] == 0 and _positive(us["actor"]) and _positive(us["learner_loop"])
    assert _positive(r["trained_env_steps_per_s"])
    assert "the median of 2 runs" in (out / "ceiling.md").read_text()
