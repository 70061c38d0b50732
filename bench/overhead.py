"""The fleet's own cost: CPU microseconds per env step of each role, on the zero-cost env.

Runs the local fleet (learner + inference server + actor with its env workers) on
`env.name=bench`, whose step costs next to nothing, so what remains is the fleet. After a
warm-up it reads every process's CPU time (user + system, psutil) and the actor's env-step
counter (its metrics endpoint) twice, `--seconds` apart, and prints per role

    CPU us per env step = (CPU seconds in the window) / (env steps in the window) x 1e6

CPU time, unlike a wall-clock rate, hardly moves when the cores are shared with other work,
so before/after comparisons of a change hold on a busy machine too.

Cases: `state` (39 floats, the reach recipe's MLP, 64 envs, chunk 1) and `64px` (the same
fleet shape as the quickstart: 20 envs, 2 workers, 64x64 images, chunk K = 8; the MLP policy
reads the states only, so the inference server's number is a small model's, and the images
still cross every other role). `--profile DIR` also writes a cProfile of the actor and the
env workers (RLFLEET_PROFILE_DIR) for `python -m pstats`.

    python bench/overhead.py                    # both cases, sampling only
    python bench/overhead.py --cases 64px --seconds 30 --train
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

CASES: dict[str, tuple[str, list[str]]] = {
    "state": (
        "metaworld_reach_ppo",
        ["env.name=bench", "env.task=state_dim=39,action_dim=4", "env.image_size=0", "env.chunk_size=1"],
    ),
    "64px": (
        "metaworld_reach_ppo",
        [
            "env.name=bench",
            "env.task=state_dim=39,action_dim=4",
            "env.image_size=64",
            "env.chunk_size=8",
            "env.max_episode_steps=160",
            "actor.num_envs=20",
            "actor.rollout_len=20",
            "learner.batch_samples=1600",
        ],
    ),
}
ROLES = ("actor", "env workers", "inference", "learner")


def _actor_env_steps(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(r"^rlfleet_actor_env_steps(?:_total)?(?:\{[^}]*\})? ([0-9.eE+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def _role(proc: psutil.Process, actor_pids: set[int]) -> str:
    if proc.ppid() in actor_pids:
        return "env workers"
    cmd = proc.cmdline()
    if "inference" in cmd:
        return "inference"
    if "actor" in cmd:
        return "actor"
    return "learner"


def _cpu_by_role() -> dict[str, float]:
    procs = psutil.Process().children(recursive=True)
    actor_pids = {p.pid for p in procs if "actor" in p.cmdline() and "inference" not in p.cmdline()}
    out = dict.fromkeys(ROLES, 0.0)
    for p in procs:
        try:
            t = p.cpu_times()
            out[_role(p, actor_pids)] += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def _stop_learner() -> None:
    procs = psutil.Process().children(recursive=True)
    actor_pids = {p.pid for p in procs if "actor" in p.cmdline() and "inference" not in p.cmdline()}
    for p in procs:
        if _role(p, actor_pids) == "learner" and p.ppid() == os.getpid():
            p.send_signal(signal.SIGINT)


def measure(case: str, seconds: float, warmup: float, train: bool, extra: list[str]) -> dict:
    recipe, overrides = CASES[case]
    return fleet_window(recipe, [*overrides, *extra], seconds, warmup, train)


def fleet_window(recipe: str, overrides: list[str], seconds: float, warmup: float, train: bool) -> dict:
    """Run the local fleet; `warmup` s after every actor's first env step, count their env steps
    and every role's CPU time for `seconds`, then stop the fleet. Also used by bench/throughput.py."""
    from rlfleet.config import load_config
    from rlfleet.runs.launcher import train_local

    actors = int(load_config(recipe, overrides).actor.num_actors)
    # learner, inference, actor i at base + 2 + i (rlfleet.runs.launcher.metrics_ports), below the
    # ephemeral range: an ephemeral port found free now may be another socket's by the time a late
    # actor binds it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ceiling import free_port_base

    base = free_port_base(actors + 2)
    result: dict = {}

    def fleet_steps() -> float | None:
        """Env steps of every actor; None until each has reported."""
        counts = [_actor_env_steps(base + 2 + i) for i in range(actors)]
        return None if any(c is None for c in counts) else float(sum(counts))  # type: ignore[arg-type]

    def watch() -> None:
        deadline = time.monotonic() + 180 + 30 * actors
        # every actor stepping (many actors start one after another on few cores), then the warm-up
        while not all((_actor_env_steps(base + 2 + i) or 0) > 0 for i in range(actors)):
            if time.monotonic() > deadline:
                result["error"] = "an actor never reported env steps"
                _stop_learner()
                return
            time.sleep(0.5)
        time.sleep(warmup)
        s0, c0, t0 = fleet_steps(), _cpu_by_role(), time.monotonic()
        time.sleep(seconds)
        s1, c1, t1 = fleet_steps(), _cpu_by_role(), time.monotonic()
        if s0 is None or s1 is None or s1 <= s0:
            result["error"] = "no env steps in the window"
            _stop_learner()
            return
        steps = s1 - s0
        result["env_steps"] = steps
        result["env_steps_per_s_wall"] = steps / (t1 - t0)
        result["us_per_env_step"] = {r: (c1[r] - c0[r]) / steps * 1e6 for r in ROLES}
        result["us_per_env_step"]["total"] = sum(result["us_per_env_step"].values())
        _stop_learner()  # done measuring: the learner stops the fleet

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            recipe,
            [
                *overrides,
                f"runner.logger.log_path={tmp}/run",
                f"runner.max_wall_seconds={warmup + seconds + 300}",  # stopped after the window
                "runner.total_env_steps=1000000000",
                "runner.checkpoint_every=1000000",
                "eval.at_end=false",
                "eval.before=false",
                "demos.bootstrap=false",
                f"learner.consume_only={str(not train).lower()}",
            ],
        )
        w = threading.Thread(target=watch, daemon=True)
        w.start()
        train_local(cfg, metrics_port=base)
        w.join(timeout=5)
    return result


def _pipe_peer(conn) -> None:  # the env worker's end of a pipe: answer every "step"
    from rlfleet.actors import env_worker

    lines = env_worker._Lines(conn)  # noqa: SLF001
    c0, n = time.thread_time(), 0
    while True:
        kind, arg = lines.recv()
        if kind == "close":
            break
        lines.send("stepped", arg)
        n += 1
    lines.send("cpu", str((time.thread_time() - c0) / max(n, 1)))


def micro(seconds: float) -> dict:
    """Two actor-side costs in isolation, in one process's CPU time (steady on a shared machine):
    SegmentBuilder per env step (record_policy + record_step + finish) and one worker-pipe round
    trip ("step s" / "stepped s") on each side."""
    import multiprocessing as mp

    import numpy as np

    from rlfleet.actors import env_worker
    from rlfleet.actors.rollout import SegmentBuilder
    from rlfleet.wire.shm import SharedArrays
    from rlfleet.wire.slots import slot_layout

    out: dict = {}
    shapes = {
        "state": (64, 64, 1, {"states": ((39,), "float32")}),
        "64px": (20, 20, 8, {"states": ((39,), "float32"), "main_images": ((64, 64, 3), "uint8")}),
    }
    for case, (E, T, K, obs) in shapes.items():
        layout = slot_layout(E, obs, 4, K)
        slots = SharedArrays.create(layout)
        B = E // 2  # one of two pipeline stages
        builder = SegmentBuilder(T, 0, B, layout)
        done = np.random.default_rng(0).random((1000, E)) < 0.01  # an episode end now and then
        kept: list = []
        n, c0, t0 = 0, time.thread_time(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            builder.record_policy(slots, 1)
            slots["episode_done"][:] = done[n % 1000]
            builder.record_step(slots)
            n += 1
            if builder.full:
                kept = [*kept[-3:], builder.finish(slots)]  # a few segments in flight, as in the send queue
        out[f"segment_builder_us_per_env_step_{case}"] = (time.thread_time() - c0) / (n * B * K) * 1e6
        slots.close()
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    peer = ctx.Process(target=_pipe_peer, args=(there,))
    peer.start()
    lines = env_worker._Lines(here)  # noqa: SLF001
    n, c0, t0 = 0, time.thread_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        lines.send("step", "1")
        lines.recv()
        n += 1
    out["pipe_round_trip_us_actor_side"] = (time.thread_time() - c0) / n * 1e6
    lines.send("close")
    out["pipe_round_trip_us_worker_side"] = float(lines.recv()[1]) * 1e6
    peer.join()
    out.update(_inference_round_trip(seconds))
    return out


def _inference_round_trip(seconds: float) -> dict:
    """One actor's shared-memory request (32 rows, the reach recipe's 64x64 MLP) against a real
    inference server in this process: wall time per round trip, and the server's CPU per request
    (process CPU minus the client thread's)."""
    import threading

    import numpy as np
    import torch

    from rlfleet.actors.inference_client import connect_inference
    from rlfleet.inference_server.policy_runner import PolicyRunner
    from rlfleet.inference_server.server import InferenceServer
    from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig
    from rlfleet.wire.shm import SharedArrays
    from rlfleet.wire.slots import slot_layout

    torch.set_num_threads(1)
    rows, state_dim, action_dim = 32, 39, 4
    policy = GaussianMLPPolicy(state_dim, action_dim, 1, PolicyConfig(hidden_sizes=[64, 64]))
    server = InferenceServer(PolicyRunner(policy, version=1), "127.0.0.1", 0, 0, max_batch=256, max_wait_ms=0.5)
    serving = threading.Thread(target=server.serve, daemon=True)
    serving.start()
    block = SharedArrays.create(slot_layout(rows, {"states": ((state_dim,), "float32")}, action_dim, 1))
    block["states"][:] = np.random.default_rng(0).standard_normal((rows, state_dim))
    client = connect_inference("shm", server.address, block)
    try:
        for _ in range(200):  # warm-up
            client.submit(0, 0, rows, deterministic=False)
            client.wait(0)
        n, c0, p0, t0 = 0, time.thread_time(), time.process_time(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            client.submit(0, 0, rows, deterministic=False)
            client.wait(0)
            n += 1
        wall, client_cpu, cpu = time.monotonic() - t0, time.thread_time() - c0, time.process_time() - p0
    finally:
        client.close()
        server.stop()
        serving.join(5)
        block.close()
    return {
        "inference_round_trip_us_wall": wall / n * 1e6,
        "inference_server_us_cpu_per_request": (cpu - client_cpu) / n * 1e6,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window per case")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds after the first env step before measuring")
    p.add_argument("--train", action="store_true", help="PPO updates run (default: the learner only consumes)")
    p.add_argument("--profile", help="write cProfile output of the actor and env workers into this folder")
    p.add_argument(
        "--micro", action="store_true", help="only isolated costs (no fleet): actor pieces, an inference round trip"
    )
    p.add_argument("--json", help="also write the results here")
    p.add_argument("overrides", nargs="*", help="extra recipe overrides for every case")
    args = p.parse_args()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        os.environ["RLFLEET_PROFILE_DIR"] = str(Path(args.profile).resolve())
    if args.micro:
        res = micro(min(args.seconds, 5.0))
        for k, v in res.items():
            print(f"{k:45s} {v:9.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2))
        return 0
    results = {}
    print(
        f"{'case':6s} {'env steps/s':>11s}  " + "  ".join(f"{r:>11s}" for r in (*ROLES, "total")) + "   (us CPU/step)"
    )
    for case in args.cases:
        r = measure(case, args.seconds, args.warmup, args.train, args.overrides)
        results[case] = r
        if "error" in r:
            print(f"{case:6s} {r['error']}", flush=True)
            continue
        us = r["us_per_env_step"]
        cells = "  ".join(f"{us[k]:11.1f}" for k in (*ROLES, "total"))
        print(f"{case:6s} {r['env_steps_per_s_wall']:11.0f}  {cells}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
