"""Metric names, the learner's TensorBoard mirror, batch-size buckets and local mode's port plan."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlfleet.runs.launcher import metrics_ports
from rlfleet.telemetry.prometheus import (
    LearnerCollector,
    MetricsPortError,
    _thread_label,
    batch_observer,
    batch_size_buckets,
    metric_name,
    role_registry,
    start_role_metrics,
)


def _families(registry) -> dict:
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_tensorboard_keys_become_valid_prometheus_names():
    assert metric_name("learner", "train/actor/approx_kl") == "rlfleet_learner_train_actor_approx_kl"
    assert metric_name("learner", "throughput/policy_lag(_max)") == "rlfleet_learner_throughput_policy_lag_max"
    assert metric_name("learner", "time/update-s") == "rlfleet_learner_time_update_s"


def _fake_learner(last_stats: dict) -> SimpleNamespace:
    ingest = SimpleNamespace(
        qsize=lambda: 3, accepted=10, duplicates=1, rejected_by_reason=lambda: {"protocol": 2, "schema": 1}
    )
    return SimpleNamespace(
        counters=SimpleNamespace(version=5, env_steps=640, update=4, trained_env_steps=600, masked_env_steps=40),
        lag_rows={0: 500, 1: 100, 3: 40},
        credits=SimpleNamespace(waits=7),
        ingest=ingest,
        cfg=SimpleNamespace(learner=SimpleNamespace(ingest_queue_size=16)),
        servicer=SimpleNamespace(
            alive_clients=lambda role: 2,
            rejected_calls=lambda: {"unknown_client": 1},
            env_faults=lambda: {"step_timeouts": 3},
        ),
        last_stats=last_stats,
        losses=SimpleNamespace(by_cause=lambda: {"actor_crashed": 160, "resume_rollback": 40}),
    )


def test_learner_collector_mirrors_scalars_and_exports_live_counters():
    registry = role_registry("learner")
    stats = {
        "train/actor/approx_kl": 0.01,
        "train/critic/explained_variance": float("nan"),
        "env/success_once/reach-v3": 0.5,
        "env/success_once/push-v3": 0.25,
        "queue/ingest_depth": 99.0,
        "lost_env_steps/actor_crashed": 80.0,  # as of the last update; the live count is newer
    }
    registry.register(LearnerCollector(_fake_learner(stats)))
    fams = _families(registry)
    assert fams["rlfleet_learner_train_actor_approx_kl"].samples[0].value == pytest.approx(0.01)
    assert "rlfleet_learner_train_critic_explained_variance" not in fams  # NaN is left out, as in TensorBoard
    assert "rlfleet_learner_queue_ingest_depth" not in fams  # exported live instead
    assert fams["rlfleet_learner_ingest_queue_depth"].samples[0].value == 3
    per_task = {s.labels["task"]: s.value for s in fams["rlfleet_learner_env_success_once_by_task"].samples}
    assert per_task == {"reach-v3": 0.5, "push-v3": 0.25}
    rejected = fams["rlfleet_learner_rejected_segments"]
    assert rejected.type == "counter"
    assert {s.labels["reason"]: s.value for s in rejected.samples if s.name.endswith("_total")} == {
        "protocol": 2,
        "schema": 1,
    }
    assert fams["rlfleet_learner_policy_version"].samples[0].value == 5
    lost = fams["rlfleet_learner_lost_env_steps"]
    assert lost.type == "counter"
    assert {s.labels["cause"]: s.value for s in lost.samples if s.name.endswith("_total")} == {
        "actor_crashed": 160,
        "resume_rollback": 40,
    }
    assert "rlfleet_learner_lost_env_steps_actor_crashed" not in fams  # the last update's copy is not mirrored
    faults = fams["rlfleet_learner_env_faults"]
    assert {s.labels["kind"]: s.value for s in faults.samples if s.name.endswith("_total")} == {"step_timeouts": 3}
    # what the updates trained on, the lag of the received rows, and the flow control's pacing
    assert fams["rlfleet_learner_trained_env_steps"].samples[0].value == 600
    assert fams["rlfleet_learner_masked_env_steps"].samples[0].value == 40
    lags = fams["rlfleet_learner_policy_lag_rows"]
    by_lag = {s.labels["lag"]: s.value for s in lags.samples if s.name.endswith("_total")}
    assert by_lag == {"0": 500, "1": 100, "3": 40}
    assert fams["rlfleet_learner_credit_waits"].samples[0].value == 7


def test_batch_sizes_fill_powers_of_two_buckets_up_to_max_batch():
    assert batch_size_buckets(20) == (1.0, 2.0, 4.0, 8.0, 16.0, 20.0, math.inf)
    assert batch_size_buckets(1) == (1.0, math.inf)
    registry = role_registry("inference")
    observe = batch_observer(registry, 8)
    now = time.monotonic()
    observe([SimpleNamespace(rows=4, arrived=now), SimpleNamespace(rows=4, arrived=now - 0.01)])
    observe([SimpleNamespace(rows=1, arrived=now - 5.0)])  # beyond the last finite edge
    fams = _families(registry)
    buckets = {
        s.labels["le"]: s.value for s in fams["rlfleet_inference_batch_size"].samples if s.name.endswith("_bucket")
    }
    assert buckets["1.0"] == 1 and buckets["4.0"] == 1 and buckets["8.0"] == 2
    assert fams["rlfleet_inference_requests"].samples[0].value == 3
    latency = {s.name: s for s in fams["rlfleet_inference_request_latency_seconds"].samples if "le" not in s.labels}
    assert latency["rlfleet_inference_request_latency_seconds_count"].value == 3
    edges = {
        float(s.labels["le"]): s.value
        for s in fams["rlfleet_inference_request_latency_seconds"].samples
        if "le" in s.labels
    }
    assert edges[max(e for e in edges if e < 1.0)] == 2 and edges[math.inf] == 3


def test_thread_and_child_process_cpu_seconds():
    """Every role's registry reports its threads' CPU by kind (main, named Python threads without
    their pool numbers, native) and its live child processes' CPU (an actor's env workers)."""
    assert _thread_label("ThreadPoolExecutor-0_12") == "ThreadPoolExecutor"
    assert _thread_label("Thread-3 (serve)") == "Thread" and _thread_label("zmq-frontend") == "zmq-frontend"
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: _spin(stop), name="spinner-3", daemon=True)
    spinner.start()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt=time.process_time()\nwhile time.process_time()-t<0.2: pass\ntime.sleep(30)",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fams = _families(role_registry("actor"))
            threads = {s.labels["thread"]: s.value for s in fams["rlfleet_thread_cpu_seconds"].samples}
            children = fams["rlfleet_children_cpu_seconds"].samples[0].value
            if threads.get("spinner", 0) > 0.05 and children >= 0.15:
                break
            time.sleep(0.2)
        assert threads["main"] > 0 and threads["spinner"] > 0.05, threads
        assert children >= 0.15 and fams["rlfleet_children_processes"].samples[0].value >= 1
    finally:
        stop.set()
        child.kill()
        child.wait()


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def test_port_zero_means_no_endpoint_and_a_taken_port_is_a_clear_error():
    assert start_role_metrics("actor", 0) is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(MetricsPortError, match="cannot serve metrics on 127.0.0.1"):
            start_role_metrics("actor", taken.getsockname()[1])


def test_local_mode_gives_each_role_its_own_port():
    assert metrics_ports(9100, 2) == {"learner": 9100, "inference": 9101, "actor0": 9102, "actor1": 9103}
    assert set(metrics_ports(0, 3).values()) == {0}
    assert metrics_ports(9100, 1, num_inference=3) == {
        "learner": 9100,
        "inference": 9101,
        "actor0": 9102,
        "inference1": 9103,
        "inference2": 9104,
    }
    with pytest.raises(ValueError):
        metrics_ports(65535, 1)
