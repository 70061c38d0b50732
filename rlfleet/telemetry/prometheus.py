"""Prometheus endpoint of each role: a per-process registry served over HTTP.

The collectors read the counters a role already keeps, at scrape time, so the training,
batching and stepping loops pay nothing for being observed; only the inference server's
batch-size and request-latency histograms are pushed (observe() calls once per batch). CPU time
per thread and of child processes (env workers) is read from /proc at scrape time (psutil), so the
cost of each role and of each thread in it (the learner's update loop vs its gRPC ingest) can be
quoted per env step (bench/ceiling.py). Metric names: `rlfleet_<role>_...`;
the learner mirrors its TensorBoard scalars as gauges (`train/actor/approx_kl` ->
`rlfleet_learner_train_actor_approx_kl`). docs/operations.md lists them all.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psutil
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rlfleet.wire.auth import is_loopback

DEFAULT_HOST = "127.0.0.1"
PER_TASK_PREFIX = "env/success_once/"  # per-task scalars become one family with a `task` label
# scalars the learner also writes to TensorBoard but that are exported live (not as of the last update)
LEARNER_LIVE_KEYS = frozenset({"queue/ingest_depth", "queue/rejected_segments", "learner/version", "actors/alive"})

log = logging.getLogger(__name__)


def metric_name(role: str, key: str) -> str:
    """A TensorBoard key as a Prometheus name: 'train/actor/approx_kl' -> 'rlfleet_learner_train_actor_approx_kl'."""
    return re.sub(r"[^a-zA-Z0-9]+", "_", f"rlfleet_{role}_{key}").strip("_")


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


def _by_label(name: str, doc: str, label: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    """A counter family with one sample per key of `counts` (reasons, RPC names: a small fixed set)."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(counts.items()):
        family.add_metric([key], float(n))
    return family


def scalar_gauges(role: str, scalars: Mapping[str, float], skip: Iterable[str] = ()) -> Iterator[GaugeMetricFamily]:
    """TensorBoard-style scalars as gauges; non-finite values are left out, as TensorBoard leaves them out."""
    skipped = set(skip)
    per_task = GaugeMetricFamily(
        metric_name(role, PER_TASK_PREFIX + "by_task"),
        "env/success_once per task over recent episodes",
        labels=["task"],
    )
    for key, value in sorted(scalars.items()):
        if key in skipped or value is None or not math.isfinite(float(value)):
            continue
        if key.startswith(PER_TASK_PREFIX):
            per_task.add_metric([key[len(PER_TASK_PREFIX) :]], float(value))
        else:
            yield _gauge(metric_name(role, key), f"{key} (as last written to TensorBoard)", value)
    if per_task.samples:
        yield per_task


class LearnerCollector(Collector):
    """The learner's counters, queue and the scalars of its last update (a `rlfleet.learner.main.Learner`)."""

    def __init__(self, learner: Any):
        self.learner = learner

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        lr = self.learner
        ingest = lr.ingest
        yield _gauge("rlfleet_learner_policy_version", "version of the newest published weights", lr.counters.version)
        yield _counter("rlfleet_learner_env_steps", "env steps received from actors", lr.counters.env_steps)
        yield _counter("rlfleet_learner_updates", "PPO updates done", lr.counters.update)
        trained = lr.counters.trained_env_steps
        yield _counter("rlfleet_learner_trained_env_steps", "env steps in rows the updates trained on", trained)
        yield _counter(
            "rlfleet_learner_masked_env_steps",
            "env steps in rows the updates masked (older than max_policy_lag, or left out by the estimator)",
            lr.counters.masked_env_steps,
        )
        yield _by_label(
            "rlfleet_learner_policy_lag_rows",
            "received rows by policy lag (learner updates between acting and training)",
            "lag",
            {str(k): v for k, v in sorted(lr.lag_rows.items())},
        )
        credits = getattr(lr, "credits", None)  # learner.flow_control: pace
        yield _counter(
            "rlfleet_learner_credit_waits",
            "segment credits that found no room at first: actors paced to the learner",
            credits.waits if credits is not None else 0,
        )
        yield _gauge("rlfleet_learner_ingest_queue_depth", "segments waiting in the ingest queue", ingest.qsize())
        yield _gauge(
            "rlfleet_learner_ingest_queue_capacity", "ingest queue bound (segments)", lr.cfg.learner.ingest_queue_size
        )
        yield _counter("rlfleet_learner_accepted_segments", "segments accepted into the ingest queue", ingest.accepted)
        yield _by_label(
            "rlfleet_learner_rejected_segments",
            "trajectory pushes rejected as malformed",
            "reason",
            ingest.rejected_by_reason(),
        )
        yield _by_label(
            "rlfleet_learner_rejected_calls",
            "other calls refused (undecodable, unknown client, stream budget), by reason",
            "reason",
            lr.servicer.rejected_calls(),
        )
        yield _counter(
            "rlfleet_learner_duplicate_segments", "retried pushes acknowledged without re-queueing", ingest.duplicates
        )
        yield _gauge(
            "rlfleet_learner_actors_alive", "actors that sent a heartbeat recently", lr.servicer.alive_clients("actor")
        )
        yield _by_label(
            "rlfleet_learner_lost_env_steps",
            "env steps taken by actors but never trained on, by cause (docs/fault_tolerance.md)",
            "cause",
            lr.losses.by_cause(),
        )
        yield _by_label(
            "rlfleet_learner_env_faults",
            "remote simulator faults the actors reported (RemoteEnv.faults), by kind",
            "kind",
            lr.servicer.env_faults(),
        )
        # lost_env_steps/* and env_faults/* of the last update: live, labelled, just above
        last = {k: v for k, v in lr.last_stats.items() if not k.startswith(("lost_env_steps/", "env_faults/"))}
        yield from scalar_gauges("learner", last, skip=LEARNER_LIVE_KEYS)


class InferenceCollector(Collector):
    """An inference server's counters (a `rlfleet.inference_server.server.InferenceServer`)."""

    def __init__(self, server: Any):
        self.server = server

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.server
        yield _counter("rlfleet_inference_batches", "policy forward passes", s.runner.batches)
        yield _counter("rlfleet_inference_rows", "observation rows answered", s.runner.rows)
        yield _by_label(
            "rlfleet_inference_rejected_requests",
            "requests answered with an error (malformed input, protocol, overload, policy failure)",
            "reason",
            s.rejected_requests(),
        )
        yield _gauge("rlfleet_inference_pending_requests", "requests waiting for a batch", s.batcher.pending())
        yield _gauge("rlfleet_inference_policy_version", "version of the weights being served", s.runner.version)
        yield _gauge("rlfleet_inference_shm_clients", "actors attached through shared memory", len(s.zmq.blocks))
        yield _counter(
            "rlfleet_inference_policy_seconds",
            "wall time spent running the policy on batches (busy fraction = its rate)",
            s.policy_seconds,
        )


def batch_size_buckets(max_batch: int) -> tuple[float, ...]:
    """Powers of two up to max_batch, and max_batch itself: full batches land in the last bucket."""
    edges, b = [], 1
    while b < max_batch:
        edges.append(float(b))
        b *= 2
    return (*edges, float(max_batch), math.inf)


# request latency edges, seconds: 50 us .. 2 s, about 1.5x apart, so p50/p99 read off them are within ~25 %
LATENCY_BUCKETS = tuple(round(50e-6 * 1.5**i, 7) for i in range(27)) + (math.inf,)


def batch_observer(registry: CollectorRegistry, max_batch: int) -> Callable[[list], None]:
    """A callback for InferenceServer.on_batch: rows per batch and each request's latency (arrival at
    the front end to answer handed back, server side) as histograms, and a request counter."""
    sizes = Histogram(
        "rlfleet_inference_batch_size",
        "rows per policy batch",
        registry=registry,
        buckets=batch_size_buckets(max_batch),
    )
    latency = Histogram(
        "rlfleet_inference_request_latency_seconds",
        "arrival of a request at the server to its answer (queueing + batching + policy)",
        registry=registry,
        buckets=LATENCY_BUCKETS,
    )
    requests = Counter("rlfleet_inference_requests", "requests answered in a batch", registry=registry)

    def observe(batch: list) -> None:
        sizes.observe(sum(r.rows for r in batch))
        requests.inc(len(batch))
        now = time.monotonic()
        for r in batch:
            latency.observe(now - r.arrived)

    return observe


class ActorCollector(Collector):
    """An actor's live counts (an `rlfleet.actors.actor.ActorCounters`)."""

    def __init__(self, counters: Any):
        self.counters = counters

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = self.counters
        yield _counter("rlfleet_actor_env_steps", "env steps simulated (substeps that ran)", c.env_steps)
        yield _counter("rlfleet_actor_segments", "trajectory segments handed to the learner link", c.segments)
        yield _counter("rlfleet_actor_episodes", "episodes finished", c.episodes)
        yield _counter("rlfleet_actor_successful_episodes", "finished episodes with success_once", c.successes)


class EnvServerCollector(Collector):
    """An env server's calls, rejected calls and open sessions (an `rlfleet.envs.env_server.EnvServicer`)."""

    def __init__(self, servicer: Any):
        self.servicer = servicer

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.servicer
        yield _by_label("rlfleet_env_server_calls", "EnvService calls received", "rpc", dict(s.calls))
        yield _by_label(
            "rlfleet_env_server_rejected_calls",
            "calls answered with an error, by gRPC status (bad input, simulator failure)",
            "code",
            dict(s.errors),
        )
        yield _by_label(
            "rlfleet_env_server_rejected_calls_by_reason", "the same calls by reason", "reason", s.rejections.snapshot()
        )
        sessions = list(s.sessions.values())
        yield _gauge("rlfleet_env_server_sessions", "open client sessions", len(sessions))
        yield _gauge(
            "rlfleet_env_server_envs",
            "env instances held by open sessions",
            sum(session.env.spec.num_envs for session in sessions),
        )


def _thread_label(name: str) -> str:
    """A Python thread name without its number: 'ThreadPoolExecutor-0_12' -> 'ThreadPoolExecutor',
    'Thread-3 (serve)' -> 'Thread' (one series per kind of thread, not per thread)."""
    base = re.sub(r" \(.*\)$", "", name)  # 'Thread-3 (serve)': Python's name for an unnamed thread
    return re.sub(r"[-_]\d+(_\d+)?$", "", base) or name


class ThreadCpuCollector(Collector):
    """CPU seconds of this process's threads by kind: `main` (the role's own loop: the learner's
    gather + update, the actor's pipeline, the inference batching loop), each named Python thread
    (pool numbers dropped) and `native` (threads Python did not start: gRPC's and ZeroMQ's I/O
    threads, torch workers). Threads that ended are no longer counted (their time stays in
    process_cpu_seconds_total)."""

    def __init__(self) -> None:
        self._proc = psutil.Process()

    def collect(self) -> Iterator[CounterMetricFamily]:
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        main_id = threading.main_thread().native_id
        totals: dict[str, float] = {}
        try:
            threads = self._proc.threads()
        except psutil.Error:  # /proc unreadable (sandbox): no series rather than a failed scrape
            threads = []
        for t in threads:
            label = "main" if t.id == main_id else _thread_label(names[t.id]) if t.id in names else "native"
            totals[label] = totals.get(label, 0.0) + t.user_time + t.system_time
        family = CounterMetricFamily(
            "rlfleet_thread_cpu_seconds", "user + system CPU seconds of this process's live threads", labels=["thread"]
        )
        for label, seconds in sorted(totals.items()):
            family.add_metric([label], seconds)
        yield family


class ChildrenCpuCollector(Collector):
    """User + system CPU seconds of this process's live child processes, all generations (an actor's
    env workers), and how many there are; not part of process_cpu_seconds_total."""

    def __init__(self) -> None:
        self._proc = psutil.Process()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        seconds, count = 0.0, 0
        try:
            children = self._proc.children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            try:
                t = child.cpu_times()
            except psutil.Error:  # it ended between the listing and the read
                continue
            seconds += t.user + t.system
            count += 1
        yield _counter("rlfleet_children_cpu_seconds", "user + system CPU seconds of live child processes", seconds)
        yield _gauge("rlfleet_children_processes", "live child processes (env workers)", count)


def _package_version() -> str:
    try:
        return importlib.metadata.version("rlfleet")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def role_registry(role: str, **info: str) -> CollectorRegistry:
    """A private registry (never the global one) with process, thread and child-process CPU metrics
    and an rlfleet_info{role=...} line."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(ThreadCpuCollector())
    registry.register(ChildrenCpuCollector())
    Info("rlfleet", "the role this process plays", registry=registry).info(
        {"role": role, "version": _package_version(), **{k: str(v) for k, v in info.items()}}
    )
    return registry


@dataclass
class MetricsEndpoint:
    """A running /metrics HTTP server; close() stops it."""

    server: Any
    thread: threading.Thread
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MetricsPortError(ValueError):
    """The metrics endpoint could not bind (port in use, bad address): a start-up error, not a crash."""


def serve_metrics(registry: CollectorRegistry, port: int, host: str = DEFAULT_HOST) -> MetricsEndpoint:
    """Serve GET /metrics from a daemon thread; loopback unless another host is asked for explicitly."""
    if not is_loopback(host):
        log.warning("metrics endpoint bound to %s: it is unauthenticated (read-only numbers, no control)", host)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MetricsPortError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    endpoint = MetricsEndpoint(server, thread, host, server.server_port)
    log.info("prometheus metrics on http://%s/metrics", endpoint.address)
    return endpoint


def start_role_metrics(
    role: str,
    port: int,
    collectors: Iterable[Collector] = (),
    host: str = DEFAULT_HOST,
    registry: CollectorRegistry | None = None,
    **info: str,
) -> MetricsEndpoint | None:
    """The usual case for a role: registry + its collectors + HTTP server; None when port is 0 (disabled)."""
    if not port:
        return None
    registry = registry or role_registry(role, **info)
    for collector in collectors:
        registry.register(collector)
    return serve_metrics(registry, port, host)
