"""The system's own ceiling: the whole fleet on the zero-cost env (`env.name=bench`).

Each point starts a real local fleet (`rlfleet.runs.launcher.train_local`: learner, one inference
server, N actor processes with their env workers) on the zero-cost simulator, lets it warm up,
then reads every role's Prometheus endpoint twice, `--seconds` apart. Everything quoted comes
from those two readings, taken from the processes themselves:

- env steps/s: the actors' `rlfleet_actor_env_steps_total`;
- CPU per env step of each role: `process_cpu_seconds_total` (whole process),
  `rlfleet_thread_cpu_seconds_total{thread}` (the learner's main loop = gather + PPO update,
  vs the rest of it = the gRPC threads that receive and check segments and serve weights) and
  `rlfleet_children_cpu_seconds_total` (an actor's env workers);
- inference: `rlfleet_inference_batch_size` and `rlfleet_inference_request_latency_seconds`
  histograms (distribution, p50/p99 interpolated inside the buckets), `_policy_seconds_total`
  (busy fraction);
- learner: segments and env steps accepted per second, and how often its ingest queue was full
  (sampled during the window: a full queue is back-pressure on the actors);
- training: env steps in rows the updates trained on (`rlfleet_learner_trained_env_steps_total`)
  beside those they masked as too old, the share trained of those (`trained_of_updated`), the
  policy lag of the received rows (`rlfleet_learner_policy_lag_rows_total{lag}`: distribution,
  mean, max), how often actors waited for credit (`learner.flow_control: pace`,
  `--flow-control`), and each role's CPU per *trained* env step.

The sweep is one factor at a time around a base point (1 actor x 16 envs, shm, 39-float state,
max_batch 256; `--base` changes it), each point once with the learner only consuming (`sampling`)
and once training PPO (`training`). The `shape` factor moves actors and envs together (1 x 128,
8 x 16, 32 x 4: the same 128 envs as one big actor or many small ones); `--base obs=64px` runs a
sweep on 64 px images instead of the state. Then the numbers are extrapolated to a cluster (see
docs/performance.md). Output: ceiling.json, ceiling.md, ceiling_sweep.png, ceiling_cpu.png in
`--out`; with the default `--out` the report also replaces the marked section of
docs/performance.md.

    python bench/ceiling.py                 # the full sweep (17 points x 2 modes, ~30 min on 2 quiet cores)
    python bench/ceiling.py --quick         # 5 points (~2 min): does it work here
    python bench/ceiling.py --factors envs,shape                     # the issue-53 table, state
    python bench/ceiling.py --factors envs,shape --base obs=64px --out docs/performance/64px --no-doc
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "performance"
DOC = REPO / "docs" / "performance.md"
DOC_BEGIN, DOC_END = "<!-- ceiling:begin -->", "<!-- ceiling:end -->"
OBS = {"state": 0, "64px": 64, "224px": 224}  # observation -> env.image_size (the state is always there)
FULL_SWEEP: dict[str, list[Any]] = {
    "envs": [4, 16, 64, 128, 256, 1024],
    "shape": ["1x128", "8x16", "32x4", "4x4"],  # actors x envs per actor
    "actors": [1, 2, 4, 8, 16],
    "transport": ["shm", "zmq", "grpc"],
    "obs": ["state", "64px", "224px"],
    "max_batch": [8, 32, 256],
}
QUICK_SWEEP: dict[str, list[Any]] = {"actors": [1, 2], "transport": ["shm", "zmq"], "obs": ["state", "64px"]}
ROLES = ("actor", "env_workers", "inference", "learner_ingest", "learner_loop")


def with_factor(point: Point, factor: str, value: Any) -> Point:
    """The point with one factor set; `shape` ("AxE") sets actors and envs per actor together."""
    if factor == "shape":
        actors, _, envs = str(value).partition("x")
        return replace(point, actors=int(actors), envs=int(envs))
    return replace(point, **{factor: value})


def factor_value(point: Point, factor: str) -> Any:
    return f"{point.actors}x{point.envs}" if factor == "shape" else getattr(point, factor)


@dataclass(frozen=True)
class Point:
    """One fleet configuration; `overrides()` turns it into recipe overrides."""

    actors: int = 1
    envs: int = 16  # per actor
    transport: str = "shm"
    obs: str = "state"
    max_batch: int = 256

    def label(self) -> str:
        return f"{self.actors}a x {self.envs}e, {self.transport}, {self.obs}, mb {self.max_batch}"

    def overrides(self) -> list[str]:
        return [
            f"actor.num_actors={self.actors}",
            f"actor.num_envs={self.envs}",
            f"actor.transport={self.transport}",
            f"env.image_size={OBS[self.obs]}",
            f"inference.max_batch={self.max_batch}",
        ]


@dataclass
class Settings:
    recipe: str
    state_dim: int
    action_dim: int
    chunk_size: int
    episode_steps: int
    busy_us: int
    warmup: float
    seconds: float
    start_timeout: float
    extra: list[str] = field(default_factory=list)
    flow_control: str = "pace"  # learner.flow_control of every point: pace (credits) or drop

    def overrides(self, point: Point, mode: str, run_dir: Path) -> list[str]:
        return [
            "env.name=bench",
            f"env.task=state_dim={self.state_dim},action_dim={self.action_dim},busy_us={self.busy_us}",
            f"env.chunk_size={self.chunk_size}",
            f"env.max_episode_steps={self.episode_steps}",
            "actor.num_workers=2",
            "actor.pipeline_stage_num=2",
            "learner.batch_samples=2048",  # bounds the learner's memory at 224 px (raised where too small: run_point)
            f"learner.consume_only={str(mode == 'sampling').lower()}",
            f"learner.flow_control={self.flow_control}",
            "runner.total_env_steps=1000000000000",
            # a safety stop only: the bench stops the learner itself once it has measured
            f"runner.max_wall_seconds={self.start_timeout + self.warmup + self.seconds + 120:.0f}",
            "runner.checkpoint_every=1000000",
            "eval.at_end=false",
            "eval.before=false",
            "eval.every_updates=0",
            "eval.every_seconds=0",
            f"runner.logger.log_path={run_dir}",
            *point.overrides(),
            *self.extra,
        ]


# --- reading the roles' /metrics --------------------------------------------------------------------


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Reading:
    at: float
    samples: Samples

    def get(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def series(self, name: str, label: str) -> dict[str, float]:
        """Every sample of `name` by the value of `label` (histogram buckets by `le`, threads by `thread`)."""
        return {dict(k[1])[label]: v for k, v in self.samples.items() if k[0] == name and label in dict(k[1])}


def scrape(address: str, timeout: float = 5.0) -> Reading:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    at = time.monotonic()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return Reading(at, samples)


def histogram_delta(a: Reading, b: Reading, name: str) -> list[tuple[float, float]]:
    """(upper edge, observations in the window) per bucket, not cumulative, from two readings."""
    cum_a, cum_b = a.series(f"{name}_bucket", "le"), b.series(f"{name}_bucket", "le")
    edges = sorted(cum_b, key=float)
    out, prev = [], 0.0
    for le in edges:
        c = cum_b[le] - cum_a.get(le, 0.0)
        out.append((float(le), c - prev))
        prev = c
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile: linear inside the bucket holding the q-th observation."""
    total = sum(n for _, n in buckets)
    if total <= 0:
        return math.nan
    rank, seen, lower = q * total, 0.0, 0.0
    for upper, n in buckets:
        if seen + n >= rank and n > 0:
            if math.isinf(upper):
                return lower  # beyond the last finite edge: report that edge
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        lower = upper if not math.isinf(upper) else lower
    return lower


# --- one fleet point -------------------------------------------------------------------------------


def free_port_base(n: int) -> int:
    """A base port with n free ports above it (the launcher gives learner, inference, actors base+i),
    below the ephemeral range: a client connecting to a port there before its server listens can
    be connected to itself by the kernel and read its own request back."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        base = random.randint(min(10000, low // 2), low - n - 1)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free range of metrics ports found")


def _learner_pid() -> int | None:
    """The learner the launcher started from this process (`rlfleet.cli learner` or torchrun)."""
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            cmd = child.cmdline()
            if "learner" in cmd or "rlfleet.learner" in cmd:
                return child.pid
    return None


@contextlib.contextmanager
def _console_to(path: Path) -> Iterator[None]:
    """The fleet's console (the learner's progress lines) into a file, not between the bench's lines."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


class Measurement(threading.Thread):
    """Waits for the fleet to run, reads every role's metrics twice, then stops the learner."""

    def __init__(self, run_dir: Path, point: Point, settings: Settings, min_updates: int = 0):
        super().__init__(name="ceiling-measure", daemon=True)
        self.run_dir, self.point, self.s = run_dir, point, settings
        self.min_updates = min_updates  # training: stretch the window (up to 4x) until this many updates ran
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.t0 = time.monotonic()
        self.started_s = math.nan
        self.fleet_ended = threading.Event()  # set when train_local returned: never signal a later fleet

    def _addresses(self) -> dict[str, str] | None:
        path = self.run_dir / "addresses" / "metrics.json"
        return json.loads(path.read_text()) if path.exists() else None

    def _wait_running(self) -> dict[str, str]:
        """All endpoints up and every actor stepping (start-up and first inference behind it)."""
        deadline = self.t0 + self.s.start_timeout
        while time.monotonic() < deadline:
            if self.fleet_ended.is_set():
                raise RuntimeError("the fleet ended before every actor stepped")
            addrs = self._addresses()
            if addrs:
                try:
                    readings = {k: scrape(a, timeout=2.0) for k, a in addrs.items()}
                    actors = [r for k, r in readings.items() if k.startswith("actor")]
                    if len(actors) == self.point.actors and all(
                        r.get("rlfleet_actor_env_steps_total") > 0 for r in actors
                    ):
                        return addrs
                except (OSError, http.client.HTTPException):
                    pass  # a role not serving yet
            time.sleep(0.5)
        raise TimeoutError(f"the fleet did not start stepping within {self.s.start_timeout:.0f}s")

    def run(self) -> None:
        try:
            addrs = self._wait_running()
            self.started_s = time.monotonic() - self.t0
            time.sleep(self.s.warmup)
            a = {k: scrape(v) for k, v in addrs.items()}
            depth, full, end = [], 0, time.monotonic() + self.s.seconds
            updates0, last_stretch = a["learner"].get("rlfleet_learner_updates_total"), end + 3 * self.s.seconds
            while True:  # the learner's queue, once a second
                left = end - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(1.0, left))
                r = scrape(addrs["learner"])
                d, cap = r.get("rlfleet_learner_ingest_queue_depth"), r.get("rlfleet_learner_ingest_queue_capacity")
                depth.append(d)
                full += d >= cap
                updates = r.get("rlfleet_learner_updates_total") - updates0
                if end - time.monotonic() <= 0 and updates < self.min_updates and end < last_stretch:
                    end = min(last_stretch, time.monotonic() + 1.0)  # a window without an update says nothing of it
            b = {k: scrape(v) for k, v in addrs.items()}
            self.result = summarise(a, b, depth, full)
        except Exception as exc:  # reported with the point; the fleet is stopped either way
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            pid = None if self.fleet_ended.is_set() else _learner_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)  # checkpoint and stop; the launcher stops the rest


def _thread_deltas(a: Reading, b: Reading) -> dict[str, float]:
    """CPU seconds of each kind of thread of one process in the window (rlfleet_thread_cpu_seconds_total)."""
    before = a.series("rlfleet_thread_cpu_seconds_total", "thread")
    after = b.series("rlfleet_thread_cpu_seconds_total", "thread")
    return {k: v - before.get(k, 0.0) for k, v in sorted(after.items())}


def _rate(a: Reading, b: Reading, name: str, **labels: str) -> tuple[float, float]:
    """(increase, seconds) of one counter between two readings of the same endpoint."""
    return b.get(name, **labels) - a.get(name, **labels), b.at - a.at


def summarise(a: dict[str, Reading], b: dict[str, Reading], depth: list[float], full: int) -> dict[str, Any]:
    actors = sorted(k for k in a if k.startswith("actor"))
    steps, rate = 0.0, 0.0
    cpu = dict.fromkeys(ROLES, 0.0)
    for k in actors:
        d, dt = _rate(a[k], b[k], "rlfleet_actor_env_steps_total")
        steps += d
        rate += d / dt
        cpu["actor"] += _rate(a[k], b[k], "process_cpu_seconds_total")[0]
        cpu["env_workers"] += _rate(a[k], b[k], "rlfleet_children_cpu_seconds_total")[0]
    la, lb = a["learner"], b["learner"]
    window = lb.at - la.at
    threads = {k: _thread_deltas(a[k], b[k]) for k in ("learner", "inference")}
    cpu["learner_loop"] = threads["learner"].get("main", 0.0)
    # the rest but the metrics endpoint's threads ('Thread': prometheus_client's HTTP server, whose
    # scrape handlers are the bench's own reads): gRPC workers and gRPC's native I/O threads
    cpu["learner_ingest"] = sum(v for k, v in threads["learner"].items() if k not in ("main", "Thread"))
    threads["learner"]["ended threads"] = _rate(la, lb, "process_cpu_seconds_total")[0] - sum(
        threads["learner"].values()
    )
    ia, ib = a["inference"], b["inference"]
    cpu["inference"] = _rate(ia, ib, "process_cpu_seconds_total")[0]
    iwin = ib.at - ia.at
    sizes = histogram_delta(ia, ib, "rlfleet_inference_batch_size")
    latency = histogram_delta(ia, ib, "rlfleet_inference_request_latency_seconds")
    batches = _rate(ia, ib, "rlfleet_inference_batch_size_count")[0]
    requests = _rate(ia, ib, "rlfleet_inference_request_latency_seconds_count")[0]
    accepted = _rate(la, lb, "rlfleet_learner_accepted_segments_total")[0]
    trained = _rate(la, lb, "rlfleet_learner_trained_env_steps_total")[0]
    masked = _rate(la, lb, "rlfleet_learner_masked_env_steps_total")[0]
    lag_before = la.series("rlfleet_learner_policy_lag_rows_total", "lag")
    lag_rows = {
        int(k): v - lag_before.get(k, 0.0)
        for k, v in lb.series("rlfleet_learner_policy_lag_rows_total", "lag").items()
        if v - lag_before.get(k, 0.0) > 0
    }
    rows = sum(lag_rows.values())
    return {
        "env_steps_per_s": rate,
        "window_s": window,
        "cpu_us_per_env_step": {r: 1e6 * c / steps if steps else math.nan for r, c in cpu.items()},
        # training only: what the updates trained on, beside what the fleet stepped
        "trained_env_steps_per_s": trained / window,
        "masked_env_steps_per_s": masked / window,
        # of the env steps the updates took (trained + masked); the learner's `trained_share` divides by
        # every env step counted, the rows still queued or carried included
        "trained_of_updated": trained / (trained + masked) if trained + masked else math.nan,
        "cpu_us_per_trained_env_step": {r: 1e6 * c / trained if trained else math.nan for r, c in cpu.items()},
        "policy_lag": {
            "distribution": {str(k): n / rows for k, n in sorted(lag_rows.items())},
            "mean": sum(k * n for k, n in lag_rows.items()) / rows if rows else math.nan,
            "max": max(lag_rows) if lag_rows else math.nan,
        },
        "credit_waits": _rate(la, lb, "rlfleet_learner_credit_waits_total")[0],
        "cpu_cores": {r: c / window for r, c in cpu.items()},
        "thread_cpu_seconds": threads,
        "inference": {
            "batches_per_s": batches / iwin,
            "requests_per_s": requests / iwin,
            "rows_per_s": _rate(ia, ib, "rlfleet_inference_rows_total")[0] / iwin,
            "mean_batch": _rate(ia, ib, "rlfleet_inference_batch_size_sum")[0] / batches if batches else math.nan,
            "batch_size_distribution": {str(le): n / batches for le, n in sizes if n} if batches else {},
            "latency_p50_ms": 1e3 * histogram_quantile(0.5, latency),
            "latency_p99_ms": 1e3 * histogram_quantile(0.99, latency),
            "busy_fraction": _rate(ia, ib, "rlfleet_inference_policy_seconds_total")[0] / iwin,
        },
        "learner": {
            "segments_per_s": accepted / window,
            "env_steps_per_s": _rate(la, lb, "rlfleet_learner_env_steps_total")[0] / window,
            "updates_per_s": _rate(la, lb, "rlfleet_learner_updates_total")[0] / window,
            "queue_depth_mean": sum(depth) / len(depth) if depth else math.nan,
            "queue_full_fraction": full / len(depth) if depth else math.nan,
            "queue_capacity": lb.get("rlfleet_learner_ingest_queue_capacity"),
        },
    }


def run_point(point: Point, mode: str, settings: Settings, work: Path) -> dict[str, Any]:
    from rlfleet.config import load_config
    from rlfleet.runs.launcher import train_local

    run_dir = work / f"{mode}-{point.actors}a-{point.envs}e-{point.transport}-{point.obs}-{point.max_batch}"
    overrides = settings.overrides(point, mode, run_dir)
    # One actor's segments (every stage's) must fit in what the learner may owe within the lag
    # bound, or flow control could never grant them all (rlfleet.learner.pacing; the config check
    # refuses such a run): many envs per actor get larger updates.
    probe = load_config(settings.recipe, [*overrides, "learner.flow_control=drop"])
    T, lag = probe.actor.rollout_len, max(probe.algorithm.max_policy_lag, 1)  # rows (samples) per segment
    batch = max(probe.learner.batch_samples, -(-T * point.envs // lag))
    cfg = load_config(settings.recipe, [*overrides, f"learner.batch_samples={batch}"])
    measure = Measurement(run_dir, point, settings, min_updates=2 if mode == "training" else 0)
    t0 = time.monotonic()
    error = None
    run_dir.mkdir(parents=True, exist_ok=True)
    with _console_to(run_dir / "console.log"):
        measure.start()
        try:
            train_local(cfg, metrics_port=free_port_base(point.actors + 2))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        measure.fleet_ended.set()
        measure.join(timeout=30)
    out: dict[str, Any] = {"point": asdict(point), "mode": mode, "wall_s": time.monotonic() - t0}
    out["batch_samples"] = int(cfg.learner.batch_samples)
    out["start_s"] = measure.started_s
    if measure.result is not None:
        out.update(measure.result)
    out["error"] = measure.error or (error if measure.result is None else None)
    return out


# --- the sweep --------------------------------------------------------------------------------------


def median_run(tries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median env steps/s of a point's repeats (every field from that one run, so
    they stay consistent), with every repeat's rate beside it; a failed repeat is the answer only
    when all failed."""
    ok = [r for r in tries if not r.get("error")]
    if not ok:
        return tries[-1]
    ranked = sorted(ok, key=lambda r: r["env_steps_per_s"])
    kept = dict(ranked[(len(ranked) - 1) // 2])
    kept["repeats_env_steps_per_s"] = [r.get("env_steps_per_s") for r in tries]
    kept["repeats_failed"] = len(tries) - len(ok)
    return kept


def sweep_points(base: Point, sweep: dict[str, list]) -> list[tuple[str, Point]]:
    """(factor, point) one factor at a time around `base`; the base point appears once, as 'base'."""
    points, seen = [("base", base)], {base}
    for factor, values in sweep.items():
        for v in values:
            p = with_factor(base, factor, v)
            if p not in seen:
                seen.add(p)
                points.append((factor, p))
    return points


def factor_series(results: list[dict], base: Point, factor: str, mode: str) -> list[tuple[Any, dict]]:
    """The results along one factor (the base point included), in sweep order."""
    rows = []
    for r in results:
        if r["mode"] != mode or r.get("error"):
            continue
        p = Point(**r["point"])
        if with_factor(p, factor, factor_value(base, factor)) != base:
            continue
        if factor == "shape" and p != base and factor_value(p, factor) not in FULL_SWEEP["shape"]:
            continue  # the envs sweep's points move actors x envs too; the shape series is its own
        rows.append((factor_value(p, factor), r))
    if factor == "obs":
        key: Any = lambda v: list(OBS).index(v[0])  # noqa: E731
    elif factor == "shape":
        key = lambda v: int(v[0].partition("x")[0])  # noqa: E731
    else:
        key = lambda v: v[0] if factor != "transport" else 0  # noqa: E731
    return sorted(rows, key=key)


def saturation(results: list[dict], base: Point, mode: str, gain: float = 1.1) -> dict[str, Any] | None:
    """Along the actors sweep: the first actor count whose next doubling raises env steps/s by less
    than `gain` x, and the best rate seen (the fleet's saturation rate on these cores)."""
    series = factor_series(results, base, "actors", mode)
    if len(series) < 2:
        return None
    knee = series[-1][0]
    for (n, r), (_, nxt) in zip(series, series[1:], strict=False):
        if nxt["env_steps_per_s"] < gain * r["env_steps_per_s"]:
            knee = n
            break
    best = max(series, key=lambda v: v[1]["env_steps_per_s"])
    return {
        "actors_at_knee": knee,
        "saturation_env_steps_per_s": best[1]["env_steps_per_s"],
        "actors_at_best": best[0],
        "inference_busy_at_best": best[1]["inference"]["busy_fraction"],
        "learner_queue_full_at_best": best[1]["learner"]["queue_full_fraction"],
    }


def bare_sim_us(env_name: str, task: str, seconds: float) -> float | None:
    """CPU microseconds per env step of a real simulator stepped bare with random actions (one
    process), to put a real simulator beside the fleet's overhead; None when it is not installed."""
    code = f"""
import time, numpy as np
from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import make_env
env = make_env(EnvConfig(name={env_name!r}, task={task!r}), 4)
env.reset()
rng, n = np.random.default_rng(0), 0
t0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - t0 < {seconds}:
    env.chunk_step(rng.uniform(-1, 1, (4, env.spec.chunk_size, env.spec.action_dim)).astype(np.float32))
    n += 4 * env.spec.chunk_size
print(1e6 * (time.process_time() - c0) / n)
"""
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=seconds + 300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    if res.returncode != 0:
        return None
    return float(res.stdout.strip().splitlines()[-1])


def bytes_per_env_step(settings: Settings, obs: str) -> dict[str, float]:
    """Bytes that cross the network per env step: to the inference server (the policy's inputs and
    its answer) and to the learner (the segment's observations, action chunk and bookkeeping),
    from the run's observation spec."""
    from rlfleet.envs.api import EnvConfig, observation_spec

    spec = observation_spec(EnvConfig(image_size=OBS[obs]), settings.state_dim)
    obs_bytes = sum(math.prod(shape) * (1 if dtype == "uint8" else 4) for shape, dtype in spec.values())
    action = settings.action_dim * settings.chunk_size * 4
    per_chunk_step = {
        # the Gaussian MLP reads the state only; actions + log-prob + value come back
        "inference": settings.state_dim * 4 + action + 8,
        # obs + final twin amortised away, actions, log-prob, value, reward, done flags, version
        "learner": obs_bytes + action + 4 * 4 + 2,
    }
    return {k: v / settings.chunk_size for k, v in per_chunk_step.items()}


def extrapolate(
    results: list[dict], base: Point, settings: Settings, host_cores: int, nic_gbit: float, sim_us: float | None
) -> dict[str, Any]:
    """The cluster on paper, from the base point's measured CPU per env step (see docs/performance.md)."""
    by_mode = {
        r["mode"]: r
        for r in results
        if not r.get("error") and Point(**r["point"]) == base and "cpu_us_per_env_step" in r
    }
    if not by_mode:
        return {}
    s = by_mode.get("sampling") or next(iter(by_mode.values()))
    t = by_mode.get("training")
    us = s["cpu_us_per_env_step"]
    actor_us = us["actor"] + us["env_workers"]
    sims = {"zero-cost env": 0.0}
    if sim_us is not None:
        sims["real simulator"] = sim_us
    # an inference server's cost per env step falls as its batches fill: at scale many actors fill
    # them, so its capacity is taken at the best-batched point measured (lowest CPU per env step)
    ok = [r for r in results if not r.get("error") and r.get("cpu_us_per_env_step", {}).get("inference", 0) > 0]
    best_inf = min(ok, key=lambda r: r["cpu_us_per_env_step"]["inference"]) if ok else s
    inf_us = best_inf["cpu_us_per_env_step"]["inference"]
    # one inference server and one learner are each one Python process: their loops share one GIL,
    # so one core's worth of CPU per env step bounds what each absorbs
    inference_cap = 1e6 / inf_us if inf_us > 0 else math.inf
    ingest_us = us["learner_ingest"] + us["learner_loop"]
    ingest_cap = 1e6 / ingest_us if ingest_us > 0 else math.inf
    train_cap = None
    if t is not None:
        tu = t["cpu_us_per_env_step"]
        train_us = tu["learner_ingest"] + tu["learner_loop"]
        train_cap = 1e6 / train_us if train_us > 0 else math.inf
    wire = bytes_per_env_step(settings, base.obs)
    out: dict[str, Any] = {
        "host_cores": host_cores,
        "nic_gbit": nic_gbit,
        "actor_side_us_per_env_step": actor_us,
        "inference_us_per_env_step": inf_us,
        "inference_capacity_at": f"{Point(**best_inf['point']).label()} ({best_inf['mode']}, mean batch "
        f"{best_inf['inference']['mean_batch']:.1f})",
        "inference_capacity_env_steps_per_s": inference_cap,
        "learner_ingest_capacity_env_steps_per_s": ingest_cap,
        "learner_training_capacity_env_steps_per_s": train_cap,
        "bytes_per_env_step": wire,
        "sims": {},
    }
    learner_cap = train_cap if train_cap is not None else ingest_cap
    nic_rate = nic_gbit * 1e9 / 8 / wire["learner"]  # env steps/s one learner NIC can take in
    for name, sim in sims.items():
        host_rate = host_cores * 1e6 / (actor_us + sim)
        limits = {
            "inference server": inference_cap,
            "learner (training)": learner_cap,
            "learner network": nic_rate,
        }
        bottleneck = min(limits, key=lambda k: limits[k])
        scale = {}
        for factor in (10, 100):
            fleet = factor * limits[bottleneck]
            scale[str(factor)] = {
                "env_steps_per_s": fleet,
                "actor_hosts": math.ceil(fleet / host_rate),
                "inference_servers": math.ceil(fleet / inference_cap),
                "learner_processes_for_ingest": math.ceil(fleet / ingest_cap),
                "learner_ingress_gbit": fleet * wire["learner"] * 8 / 1e9,
                "inference_ingress_gbit": fleet * wire["inference"] * 8 / 1e9,
            }
        out["sims"][name] = {
            "sim_us_per_env_step": sim,
            "actor_host_env_steps_per_s": host_rate,
            "hosts_per_inference_server": inference_cap / host_rate,
            "hosts_per_learner": learner_cap / host_rate,
            "first_bottleneck": bottleneck,
            "fleet_limit_env_steps_per_s": limits[bottleneck],
            "at": scale,
        }
    return out


# --- report ---------------------------------------------------------------------------------------


def _f(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:,.{digits}f}"


def markdown(report: dict) -> str:
    meta, results, base = report["meta"], report["results"], Point(**report["meta"]["base"])
    lines = []
    if meta.get("label"):
        lines += [f"> **{meta['label']}**", ""]
    lines += [
        f"Measured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs, load average at start "
        f"{meta['load_at_start']}), commit {meta['commit']}, command `{meta['command']}`.",
        f"Zero-cost env: state {meta['settings']['state_dim']} floats, action {meta['settings']['action_dim']}, "
        f"chunk {meta['settings']['chunk_size']}, episodes of {meta['settings']['episode_steps']} steps, "
        f"busy-wait {meta['settings']['busy_us']} µs; {meta['settings']['warmup']:.0f} s warm-up, "
        f"{meta['settings']['seconds']:.0f} s measured per point"
        + (f", the median of {meta['repeat']} runs in rounds" if meta.get("repeat", 1) > 1 else "")
        + f". One factor at a time around the base point ({base.label()}).",
        "",
        "### Env steps/s of the fleet",
        "",
        "| factor | point | sampling | training | training / sampling | inference mean batch | "
        "inference p50 / p99 ms | inference busy | learner segments/s | learner queue full |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for factor, point in report["points"]:
        p = Point(**point)
        rs = {r["mode"]: r for r in results if Point(**r["point"]) == p}
        s, t = rs.get("sampling", {}), rs.get("training", {})
        si = s.get("inference", {})
        sl = s.get("learner", {})
        ratio = (
            t["env_steps_per_s"] / s["env_steps_per_s"]
            if s.get("env_steps_per_s") and t.get("env_steps_per_s")
            else None
        )
        cell = lambda r: _f(r.get("env_steps_per_s")) if not r.get("error") else "failed"  # noqa: E731
        lines.append(
            f"| {factor} | {p.label()} | {cell(s)} | {cell(t)} | {_f(ratio, 2)} | {_f(si.get('mean_batch'), 1)} | "
            f"{_f(si.get('latency_p50_ms'), 2)} / {_f(si.get('latency_p99_ms'), 2)} | "
            f"{_f(100 * si['busy_fraction'] if si else None)} % | {_f(sl.get('segments_per_s'), 1)} | "
            f"{_f(100 * sl['queue_full_fraction'] if sl else None)} % |"
        )
    errors = [r for r in results if r.get("error")]
    if errors:
        lines += [
            "",
            "Failed points: " + "; ".join(f"{Point(**r['point']).label()} {r['mode']}: {r['error']}" for r in errors),
        ]
    lines += [
        "",
        "### CPU per env step of each role (µs, read from the processes)",
        "",
        "actor = the actor process (pipeline loop, inference client, segment sender); env workers = its "
        "child processes; learner loop = its main thread (gather + PPO update + weight publication); learner "
        "ingest = its gRPC threads (receive, decode and check segments, serve weights); cores busy = all of it "
        "over wall time.",
        "",
        "| point | mode | " + " | ".join(ROLES) + " | total | cores busy |",
        "|---|---|" + "---:|" * (len(ROLES) + 2),
    ]
    for r in results:
        if r.get("error") or "cpu_us_per_env_step" not in r:
            continue
        us, cores = r["cpu_us_per_env_step"], r["cpu_cores"]
        lines.append(
            f"| {Point(**r['point']).label()} | {r['mode']} | "
            + " | ".join(_f(us[k], 1) for k in ROLES)
            + f" | {_f(sum(us.values()), 1)} | {_f(sum(cores.values()), 2)} |"
        )
    trained_rows = [r for r in results if r["mode"] == "training" and not r.get("error") and "trained_of_updated" in r]
    if trained_rows:
        lines += [
            "",
            "### What training trained on (training mode)",
            "",
            f"learner.flow_control: {meta['settings'].get('flow_control', 'pace')}. Stepped: the actors' env "
            "steps/s; trained: env steps/s in rows the updates trained on (masked: older than "
            "max_policy_lag); trained of updated: trained / (trained + masked); lag: the policy lag of the "
            "received rows over the window; µs per trained env step: every role's CPU over the trained "
            "env steps.",
            "",
            "| point | stepped/s | trained/s | trained of updated | lag mean / max | lag distribution | credit waits | "
            "µs per trained env step (" + ", ".join(ROLES) + ") | total |",
            "|---|---:|---:|---:|---:|---|---:|---|---:|",
        ]
        for r in trained_rows:
            lag, per = r["policy_lag"], r["cpu_us_per_trained_env_step"]
            dist = ", ".join(f"{k}: {100 * v:.0f}%" for k, v in lag["distribution"].items())
            lines.append(
                f"| {Point(**r['point']).label()} | {_f(r['env_steps_per_s'])} | {_f(r['trained_env_steps_per_s'])} | "
                f"{_f(100 * r['trained_of_updated'], 1)} % | {_f(lag['mean'], 2)} / {_f(lag['max'])} | {dist} | "
                f"{_f(r.get('credit_waits'))} | " + ", ".join(_f(per[k], 1) for k in ROLES) + f" | "
                f"{_f(sum(per.values()), 1)} |"
            )
    lines += ["", "### Inference batch sizes (base point, sampling: fraction of batches per bucket)", ""]
    base_s = next(
        (r for r in results if r["mode"] == "sampling" and Point(**r["point"]) == base and not r.get("error")), None
    )
    if base_s:
        dist = base_s["inference"]["batch_size_distribution"]
        lines += ["| rows <= | " + " | ".join(dist) + " |", "|---|" + "---:|" * len(dist)]
        lines += ["| batches | " + " | ".join(f"{100 * v:.0f} %" for v in dist.values()) + " |"]
    for mode in ("sampling", "training"):
        sat = report["saturation"].get(mode)
        if sat:
            lines += [
                "",
                f"Saturation ({mode}): adding actors stops paying (< 1.1x per step of the actors sweep) after "
                f"{sat['actors_at_knee']} actor(s); the best rate is {_f(sat['saturation_env_steps_per_s'])} env "
                f"steps/s with {sat['actors_at_best']} actor(s), where the inference server is "
                f"{_f(100 * sat['inference_busy_at_best'])} % busy and the learner's queue is full "
                f"{_f(100 * sat['learner_queue_full_at_best'])} % of the time.",
            ]
    ex = report.get("extrapolation") or {}
    if ex:
        lines += [
            "",
            "### Cluster extrapolation (computed from the base point)",
            "",
            f"Assumptions: an actor host has {ex['host_cores']} cores all stepping envs at the measured actor-side "
            f"cost ({_f(ex['actor_side_us_per_env_step'], 1)} µs per env step: actor + env workers) plus the "
            "simulator's own cost; one inference server and one learner are each one Python process, so one "
            "core over their measured CPU per env step estimates what each could absorb (estimates on paper, "
            "not limits this machine reached: on 2 cores no role had a core to itself; inference "
            f"{_f(ex['inference_capacity_env_steps_per_s'])} env steps/s, {_f(ex['inference_us_per_env_step'], 1)} µs "
            f"per env step at its best-batched point, {ex['inference_capacity_at']}; learner ingest only "
            f"{_f(ex['learner_ingest_capacity_env_steps_per_s'])}; learner ingest + PPO update "
            f"{_f(ex['learner_training_capacity_env_steps_per_s'])}); the learner's NIC carries {ex['nic_gbit']:g} "
            f"Gbit/s at {_f(ex['bytes_per_env_step']['learner'])} bytes per env step "
            f"(inference requests {_f(ex['bytes_per_env_step']['inference'])} bytes).",
            "",
            "| simulator | µs/step (sim) | env steps/s per actor host | actor hosts per inference server | "
            "actor hosts per learner | first bottleneck (estimated) | fleet limit env steps/s (estimated) |",
            "|---|---:|---:|---:|---:|---|---:|",
        ]
        for name, v in ex["sims"].items():
            lines.append(
                f"| {name} | {_f(v['sim_us_per_env_step'], 1)} | {_f(v['actor_host_env_steps_per_s'])} | "
                f"{_f(v['hosts_per_inference_server'], 2)} | {_f(v['hosts_per_learner'], 2)} | "
                f"{v['first_bottleneck']} | {_f(v['fleet_limit_env_steps_per_s'])} |"
            )
        lines += [
            "",
            "At 10x and 100x that limit:",
            "",
            "| simulator | scale | env steps/s | actor hosts | inference servers | learner processes (ingest) | "
            "learner ingress Gbit/s | inference ingress Gbit/s |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, v in ex["sims"].items():
            for factor, a in v["at"].items():
                lines.append(
                    f"| {name} | {factor}x | {_f(a['env_steps_per_s'])} | {a['actor_hosts']} | "
                    f"{a['inference_servers']} | {a['learner_processes_for_ingest']} | "
                    f"{_f(a['learner_ingress_gbit'], 2)} | {_f(a['inference_ingress_gbit'], 2)} |"
                )
        lines += ["", _bottleneck_text(ex)]
    lines += [
        "",
        "Plots: `ceiling_sweep.png` (env steps/s along each factor), `ceiling_cpu.png` (µs per env step by role).",
    ]
    return "\n".join(lines) + "\n"


def _bottleneck_text(ex: dict) -> str:
    """What changes with scale, worded from the computed numbers (each claim follows from a comparison)."""
    out = []
    split_ingest = False
    for name, v in ex["sims"].items():
        hosts = min(v["hosts_per_inference_server"], v["hosts_per_learner"])
        text = (
            f"With the {name}, the {v['first_bottleneck']} is the first limit on paper "
            f"({_f(v['fleet_limit_env_steps_per_s'])} env steps/s, {_f(hosts, 2)} actor hosts of "
            f"{ex['host_cores']} cores)."
        )
        for factor, a in v["at"].items():
            nic = a["learner_ingress_gbit"] / ex["nic_gbit"]
            text += (
                f" At {factor}x: {a['actor_hosts']} actor hosts, {a['inference_servers']} inference servers, "
                f"{a['learner_processes_for_ingest']} learner processes' worth of ingest CPU, "
                f"{a['learner_ingress_gbit']:.2f} Gbit/s into the learner ({100 * nic:.0f} % of its link)."
            )
            split_ingest |= a["learner_processes_for_ingest"] > 1
        out.append(text)
    if split_ingest:
        out.append(
            "More than one learner process' worth of ingest means the single learner process that receives "
            "every segment (DDP ranks only train) must be split into several receivers."
        )
    return " ".join(out)


def plots(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, base = report["results"], Point(**report["meta"]["base"])
    factors = [f for f in report["sweep"] if len(report["sweep"][f]) > 1] or ["actors"]
    fig, axes = plt.subplots(1, len(factors), figsize=(4 * len(factors), 3.4), squeeze=False)
    for ax, factor in zip(axes[0], factors, strict=False):
        for mode, marker in (("sampling", "o"), ("training", "s")):
            series = factor_series(results, base, factor, mode)
            if series:
                ax.plot(
                    [str(v) for v, _ in series], [r["env_steps_per_s"] for _, r in series], marker=marker, label=mode
                )
            if series and mode == "training" and all("trained_env_steps_per_s" in r for _, r in series):
                ax.plot(
                    [str(v) for v, _ in series],
                    [r["trained_env_steps_per_s"] for _, r in series],
                    marker="x",
                    linestyle="--",
                    label="trained",
                )
        ax.set_title(factor)
        ax.set_ylabel("env steps/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(report["meta"].get("label") or "fleet on the zero-cost env", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "ceiling_sweep.png", dpi=110)
    plt.close(fig)

    ok = [r for r in results if not r.get("error") and "cpu_us_per_env_step" in r]
    if ok:
        fig, ax = plt.subplots(figsize=(max(7, 0.5 * len(ok) + 3), 4.5))
        names = [f"{Point(**r['point']).label()}\n{r['mode']}" for r in ok]
        bottom = [0.0] * len(ok)
        for role in ROLES:
            vals = [r["cpu_us_per_env_step"][role] for r in ok]
            ax.bar(range(len(ok)), vals, bottom=bottom, label=role)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(range(len(ok)), names, rotation=90, fontsize=6)
        ax.set_ylabel("CPU µs per env step")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_title("CPU per env step by role", fontsize=10)
        if report["meta"].get("label"):
            fig.suptitle(report["meta"]["label"], fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "ceiling_cpu.png", dpi=110)
        plt.close(fig)


def update_doc(doc: Path, text: str) -> bool:
    """Replace the marked section of docs/performance.md with the generated report."""
    if not doc.exists():
        return False
    body = doc.read_text()
    if DOC_BEGIN not in body or DOC_END not in body:
        return False
    head, rest = body.split(DOC_BEGIN, 1)
    _, tail = rest.split(DOC_END, 1)
    doc.write_text(f"{head}{DOC_BEGIN}\n{text}{DOC_END}{tail}")
    return True


def _git_commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few points, shorter windows (~2 min)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for ceiling.json/.md/.png")
    p.add_argument(
        "--factors",
        default="all",
        help="comma-separated subset of " + ",".join(FULL_SWEEP) + "; 'none': the base point only",
    )
    p.add_argument("--modes", default="sampling,training")
    p.add_argument("--base", default="", help="base point, e.g. actors=2,envs=32,transport=zmq")
    p.add_argument("--seconds", type=float, help="measured seconds per point (default 6, quick 3)")
    p.add_argument("--repeat", type=int, default=1, help="runs per point and mode, interleaved; the median run is kept")
    p.add_argument("--warmup", type=float, help="seconds after every actor stepped (default 3, quick 2)")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument(
        "--recipe", default="metaworld_reach_ppo", help="policy and algorithm settings (the env is replaced)"
    )
    p.add_argument("--state-dim", type=int, default=39)
    p.add_argument("--action-dim", type=int, default=4)
    p.add_argument("--chunk-size", type=int, default=1)
    p.add_argument("--episode-steps", type=int, default=150)
    p.add_argument("--busy-us", type=int, default=0, help="busy-wait per env step (a simulator of that cost)")
    p.add_argument(
        "--sim",
        default="metaworld:reach-v3",
        help="ENV:TASK whose bare step cost goes beside the zero-cost env in the extrapolation ('' skips)",
    )
    p.add_argument("--host-cores", type=int, default=32, help="cores of an actor host in the extrapolation")
    p.add_argument("--nic-gbit", type=float, default=25.0, help="the learner's network link in the extrapolation")
    p.add_argument("--label", default="", help="a line at the top of the report (e.g. SMOKE: noisy machine)")
    p.add_argument("--no-doc", action="store_true", help="do not update docs/performance.md")
    p.add_argument(
        "--report-only", action="store_true", help="rebuild the report from --out/ceiling.json without running"
    )
    p.add_argument(
        "--compare",
        metavar="BEFORE_JSON",
        help="with --report-only: set --out's points beside those of an earlier ceiling.json (compare.md)",
    )
    p.add_argument(
        "--flow-control",
        default="pace",
        choices=["pace", "drop"],
        help="learner.flow_control of every point: pace actors to the learner, or drop rows too old to train",
    )
    p.add_argument("overrides", nargs="*", help="extra recipe overrides for every point")
    args = p.parse_args(argv)
    if args.report_only:
        return report_only(args)

    sweep: dict[str, list[Any]] = QUICK_SWEEP if args.quick else FULL_SWEEP
    if args.factors == "none":
        sweep = {}
    elif args.factors != "all":
        sweep = {f: FULL_SWEEP[f] for f in args.factors.split(",")}
    base = Point()
    for item in filter(None, args.base.split(",")):
        k, _, v = item.partition("=")
        value: Any = v if k in ("transport", "obs", "shape") else int(v)
        base = with_factor(base, k, value)
    modes = args.modes.split(",")
    settings = Settings(
        args.recipe,
        args.state_dim,
        args.action_dim,
        args.chunk_size,
        args.episode_steps,
        args.busy_us,
        args.warmup if args.warmup is not None else (2.0 if args.quick else 3.0),
        args.seconds if args.seconds is not None else (3.0 if args.quick else 6.0),
        args.start_timeout,
        list(args.overrides),
        args.flow_control,
    )
    points = sweep_points(base, sweep)
    if args.quick:  # the base point trains; the others only sample
        runs = [(f, pt, m) for f, pt in points for m in modes if m == "sampling" or pt == base]
    else:
        runs = [(f, pt, m) for f, pt in points for m in modes]
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "cpus": os.cpu_count(),
        "load_at_start": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
        "commit": _git_commit(),
        "command": "python bench/ceiling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "repeat": args.repeat,
        "label": args.label,
        "base": asdict(base),
        "settings": {k: v for k, v in asdict(settings).items() if k != "extra"} | {"overrides": settings.extra},
    }
    print(
        f"{len(runs)} fleet runs, ~{len(runs) * (settings.warmup + settings.seconds + 12):.0f} s plus start-ups",
        flush=True,
    )
    tries: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(runs))}
    with tempfile.TemporaryDirectory(prefix="ceiling-") as tmp:
        # rounds, not back-to-back repeats: a slow minute on the machine hits every point once
        for rnd in range(args.repeat):
            for i, (factor, point, mode) in enumerate(runs):
                r = run_point(point, mode, settings, Path(tmp))
                tries[i].append(r)
                status = r["error"] or f"{r['env_steps_per_s']:,.0f} env steps/s"
                print(
                    f"[{rnd * len(runs) + i + 1}/{args.repeat * len(runs)}] {factor:9s} {point.label():40s} "
                    f"{mode:8s} {status}  (stepping after {r['start_s']:.0f} s, {r['wall_s']:.0f} s in all)",
                    flush=True,
                )
    results = [median_run(tries[i]) for i in range(len(runs))]
    sim_us = None
    if args.sim:
        name, _, task = args.sim.partition(":")
        sim_us = bare_sim_us(name, task, 2.0 if args.quick else 5.0)
    report: dict[str, Any] = {
        # env steps: the substeps simulated (issue 50; reports before it counted K per chunk)
        "meta": meta | {"sim": args.sim, "sim_us_per_env_step": sim_us, "env_step_count": "simulated"},
        "sweep": sweep,
        "points": [(f, asdict(pt)) for f, pt in points],
        "results": results,
    }
    write_report(report, args, settings)
    return 0 if all(not r.get("error") for r in results) else 1


def write_report(report: dict[str, Any], args: argparse.Namespace, settings: Settings) -> None:
    """Saturation and extrapolation from the results, then ceiling.json/.md, the plots and the doc."""
    base, results = Point(**report["meta"]["base"]), report["results"]
    modes = sorted({r["mode"] for r in results}, key=["sampling", "training"].index)
    report["saturation"] = {m: saturation(results, base, m) for m in modes}
    report["extrapolation"] = extrapolate(
        results, base, settings, args.host_cores, args.nic_gbit, report["meta"].get("sim_us_per_env_step")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ceiling.json").write_text(json.dumps(report, indent=2, default=str))
    text = markdown(report)
    (args.out / "ceiling.md").write_text(text)
    plots(report, args.out)
    if not args.no_doc and args.out.resolve() == DEFAULT_OUT.resolve() and update_doc(DOC, text):
        print(f"updated {DOC}")
    print(text)
    print(f"written to {args.out}")


def compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Markdown: each point and mode of `after` beside the same one in `before` (two ceiling.json
    reports): env steps/s (training: trained), CPU per (trained) env step of every role together,
    the trained share and the cores busy."""

    def key(r: dict[str, Any]) -> tuple[str, str]:
        return Point(**r["point"]).label(), r["mode"]

    old = {key(r): r for r in before["results"] if not r.get("error")}
    lines = [
        f"Before: commit {before['meta']['commit']}, {before['meta']['date']}; after: commit "
        f"{after['meta']['commit']}, {after['meta']['date']} "
        f"({after['meta']['machine']}, {after['meta']['cpus']} CPUs).",
        "Training rows: env steps/s trained, CPU per trained env step; sampling rows: stepped.",
        "",
        "| point | mode | env steps/s before | after | x | µs per env step before | after | x | "
        "trained of updated before / after | cores busy before / after |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in after["results"]:
        b = old.get(key(r))
        if r.get("error") or b is None:
            continue
        training = r["mode"] == "training"
        rate = "trained_env_steps_per_s" if training else "env_steps_per_s"
        cost = "cpu_us_per_trained_env_step" if training else "cpu_us_per_env_step"
        rb, ra = b[rate], r[rate]
        cb, ca = sum(b[cost].values()), sum(r[cost].values())
        share = (
            f"{100 * b['trained_of_updated']:.1f} % / {100 * r['trained_of_updated']:.1f} %"
            if training and "trained_of_updated" in b and "trained_of_updated" in r
            else "–"
        )
        busy = f"{sum(b['cpu_cores'].values()):.2f} / {sum(r['cpu_cores'].values()):.2f}"
        lines.append(
            f"| {key(r)[0]} | {r['mode']} | {_f(rb)} | {_f(ra)} | {ra / rb:.2f} | {_f(cb, 1)} | {_f(ca, 1)} | "
            f"{ca / cb:.2f} | {share} | {busy} |"
        )
    return "\n".join(lines) + "\n"


def report_only(args: argparse.Namespace) -> int:
    """Rebuild the page, plots and extrapolation from `--out`/ceiling.json (no fleet runs)."""
    report = json.loads((args.out / "ceiling.json").read_text())
    if args.compare:
        text = compare(json.loads(Path(args.compare).read_text()), report)
        (args.out / "compare.md").write_text(text)
        print(text)
        return 0
    kept = dict(report["meta"]["settings"])
    settings = Settings(**{k: v for k, v in kept.items() if k != "overrides"}, extra=kept.get("overrides", []))
    write_report(report, args, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
