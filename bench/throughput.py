"""The fleet at the simulator limit: fleet throughput over the bare simulator loop, one run.

Parts (`--only`, default all three):

state   reach-v3 (metaworld_reach_ppo: 64 envs, 2 workers, 2 stages). The bare loop steps the
        same env slices as the fleet's workers (one process per worker, same offsets, random
        actions) with nothing else; beside it the fleet sampling only (the learner consumes
        and drops segments) and the fleet while PPO trains. Aims: sampling >= 0.9, training
        >= 0.85 of the bare loop.
pixels  the quickstart's settings (metaworld_quickstart_tinyoft: 20 envs, 2 worker processes,
        5 tasks, 64 px, chunk K = 8): a bare loop that steps and renders exactly as the
        quickstart's workers do, beside fleet sampling and training with the quickstart's
        policy (tiny_oft; freshly initialised weights, which cost the same as trained ones,
        so no SFT bootstrap runs). Aims: sampling >= 0.95, training >= 0.9.
render  frames per CPU-second (frames/s per core) at 64 and 224 px through rlfleet's render
        path (a MetaWorld env's `render_one`, which is what the env workers call) against
        MuJoCo's own offscreen renderer (`mujoco.Renderer`, same model, same scene settings)
        driven bare beside it. Aim: >= 0.9. MuJoCo's defaults (shadows, reflections,
        multisampling) are printed too, for reference.

A fleet's rate is its actors' env-step counters, summed, over a window of `--seconds`, `--warmup` s
after every actor's first env step (start-up and the first updates left out), the same length as
the bare loop's window, which steps every actor's env slices (`actor.num_actors=8
actor.num_envs=8`: 8 actors' 16 workers against 16 bare processes); bench/overhead.py's CPU us
per env step of each role come along in the JSON, and the env workers' CPU per env step in the
fleet is set beside the bare loop's (a ratio that, unlike the rates, hardly moves when other work
shares the cores).
Each measurement is repeated 3 times, alternating (bare, sampling, training, bare, ...), so
the machine's load drifts across all of them alike; a ratio is the median over the repeats
of (fleet / bare of the same repeat). Results also go to `--json` for docs/performance.md.

Each fleet ratio is also split into its two factors (`decompose`): the CPU one env step costs
in the bare loop over what it costs the whole fleet, and how busy the fleet keeps the cores
compared with the bare loop; plus the fleet's CPU per env step beyond the bare loop's, by role.
`--report FILE` prints the summary of an earlier `--json` again (adding that split if missing).

    python bench/throughput.py                         # make bench
    python bench/throughput.py --only pixels --seconds 60 --warmup 20
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

PARTS = ("state", "pixels", "render")
RECIPES = {"state": "metaworld_reach_ppo", "pixels": "metaworld_quickstart_tinyoft"}
AIMS = {
    "state": {"sampling": 0.9, "training": 0.85},
    "pixels": {"sampling": 0.95, "training": 0.9},
    "render": 0.9,
}
# no before/after evaluation, no SFT bootstrap (a fresh policy costs what a trained one does)
FLEET_OVERRIDES = ["eval.at_end=false", "eval.before=false", "demos.bootstrap=false", "runner.checkpoint_every=1000000"]


def _bare_worker(
    env_cfg: dict, slices: list, seconds: float, barrier: Any, out: Any, seed: int
) -> None:  # one env worker's job, without the fleet
    from rlfleet.envs.registry import build_env_config, make_env

    cfg = build_env_config(env_cfg)
    envs = [make_env(cfg, sl.hi - sl.lo, env_offset=sl.global_offset) for sl in slices]
    for env in envs:
        env.reset()
    rng = np.random.default_rng(seed)
    K, D = cfg.chunk_size, envs[0].spec.action_dim
    sizes = [sl.hi - sl.lo for sl in slices]
    actions = [rng.uniform(-1, 1, (64, n, K, D)).astype(np.float32) for n in sizes]
    barrier.wait()  # every worker starts the clock together: the rates share the same cores
    steps, i, t0, c0 = 0, 0, time.monotonic(), time.process_time()
    while time.monotonic() - t0 < seconds:
        for env, acts in zip(envs, actions):  # stage by stage, as a worker steps its slices
            steps += int(env.chunk_step(acts[i % 64]).substeps.sum())  # simulated, as the fleet counts
        i += 1
    out.put((steps / (time.monotonic() - t0), time.process_time() - c0, steps))
    for env in envs:
        env.close()


def bare_loop(cfg: Any, seconds: float) -> tuple[float, float]:
    """Env steps/s of the fleet's env slices (every actor's) stepped in bare loops, one process
    per env worker, and their CPU us per env step (to set beside the fleet's env workers')."""
    from rlfleet.actors.env_worker import stage_slices
    from rlfleet.config import as_dict

    a = cfg.actor
    E = a.num_envs
    env_cfg = {**as_dict(cfg.env), "fleet_envs": max(cfg.env.get("fleet_envs", 0), a.num_actors * E)}
    # single-threaded numerics, as the launcher gives every role (and so every env worker)
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    ctx = mp.get_context("spawn")
    # every actor's workers (actor i's envs at offset i x E), as many processes as the fleet's
    workers = [
        slices for i in range(a.num_actors) for slices in stage_slices(E, a.pipeline_stage_num, a.num_workers, i * E)
    ]
    q, barrier = ctx.Queue(), ctx.Barrier(len(workers))
    procs = [
        ctx.Process(target=_bare_worker, args=(env_cfg, slices, seconds, barrier, q, w))
        for w, slices in enumerate(workers)
    ]
    for p in procs:
        p.start()
    try:
        got = [q.get(timeout=seconds + 300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    return float(sum(g[0] for g in got)), sum(g[1] for g in got) / max(sum(g[2] for g in got), 1) * 1e6


def fleet(recipe: str, overrides: list[str], seconds: float, warmup: float, consume_only: bool) -> dict:
    """The local fleet's env steps/s (the actors' own counters, summed) over `seconds`, `warmup` s
    after every actor's first env step, with every role's CPU us per env step (bench/overhead.py's
    measurement)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from overhead import fleet_window

    out = fleet_window(recipe, [*FLEET_OVERRIDES, *overrides], seconds, warmup, train=not consume_only)
    if "error" in out:
        raise RuntimeError(f"fleet run of {recipe} failed: {out['error']}")
    return out


def fleet_part(
    part: str,
    overrides: list[str],
    seconds: float,
    warmup: float,
    repeats: int,
    on_repeat: Callable[[dict], None] | None = None,
) -> dict:
    """`repeats` alternating rounds of bare loop, sampling fleet and training fleet; the summary
    over the rounds so far also goes to `on_repeat` after each round (a cut run keeps them)."""
    from rlfleet.config import load_config

    recipe = RECIPES[part]
    cfg = load_config(recipe, [*FLEET_OVERRIDES, *overrides])
    a = cfg.actor
    print(
        f"[{part}] {recipe}: {cfg.env.task}, {a.num_envs * a.num_actors} envs, {a.num_workers * a.num_actors} "
        f"workers, {a.pipeline_stage_num} stages, image {cfg.env.image_size} px, chunk {cfg.env.chunk_size}, "
        f"policy {cfg.policy.name}",
        flush=True,
    )
    runs: dict[str, list[float]] = {"bare": [], "sampling": [], "training": []}
    cpu: dict[str, list] = {"bare": [], "sampling": [], "training": []}
    for r in range(repeats):
        rate, us = bare_loop(cfg, seconds)
        runs["bare"].append(rate)
        cpu["bare"].append(us)
        for kind in ("sampling", "training"):
            got = fleet(recipe, overrides, seconds, warmup, consume_only=kind == "sampling")
            runs[kind].append(got["env_steps_per_s_wall"])
            cpu[kind].append(got["us_per_env_step"])
        print(
            f"[{part}] repeat {r + 1}: bare {runs['bare'][-1]:7.0f}  sampling {runs['sampling'][-1]:7.0f}  "
            f"training {runs['training'][-1]:7.0f} env steps/s; env workers' CPU us per env step: bare "
            f"{cpu['bare'][-1]:.0f}, sampling {cpu['sampling'][-1]['env workers']:.0f}, "
            f"training {cpu['training'][-1]['env workers']:.0f}",
            flush=True,
        )
        if on_repeat is not None:
            on_repeat(_part_summary(recipe, runs, cpu))
    return _part_summary(recipe, runs, cpu)


def _part_summary(recipe: str, runs: dict[str, list[float]], cpu: dict[str, list]) -> dict:
    """Medians over the repeats of a fleet part, with their ratios and the ratios' split."""
    out: dict[str, Any] = {
        "recipe": recipe,
        "repeats": len(runs["bare"]),
        "env_steps_per_s": runs,
        "cpu_us_per_env_step": cpu,
        "env_step_count": "simulated",  # substeps that ran (issue 50; earlier reports: K per chunk)
    }
    for kind in ("sampling", "training"):
        ratios = [f / b for f, b in zip(runs[kind], runs["bare"])]
        out[f"{kind}/bare"] = statistics.median(ratios)
        out[f"{kind}/bare_repeats"] = ratios
    out["median_env_steps_per_s"] = {k: statistics.median(v) for k, v in runs.items()}
    # load-robust companion: the env workers' CPU per env step in the fleet over the bare loop's
    out["worker_cpu_per_step_sampling/bare"] = statistics.median(
        c["env workers"] / b for c, b in zip(cpu["sampling"], cpu["bare"])
    )
    for kind in ("sampling", "training"):
        out[f"{kind}/why"] = decompose(runs["bare"], cpu["bare"], runs[kind], cpu[kind])
    return out


def decompose(bare_rates: list[float], bare_cpu: list[float], rates: list[float], cpu: list[dict]) -> dict:
    """Why a fleet's ratio is what it is, from the same repeats (medians over them).

    A rate is the cores kept busy over the CPU one env step costs, so for every repeat exactly
        fleet / bare = (bare CPU per step / fleet CPU per step) x (fleet's busy cores / bare's).
    The first factor is what the fleet's own work costs, the second is idle time (waits, wake-ups);
    `extra_us` splits the fleet's CPU per step beyond the bare loop's by role.
    """
    cost, busy, extra = [], [], []
    for b_rate, b_us, f_rate, f_us in zip(bare_rates, bare_cpu, rates, cpu):
        cost.append(b_us / f_us["total"])
        busy.append((f_us["total"] * f_rate) / (b_us * b_rate))
        extra.append(
            {"env workers": f_us["env workers"] - b_us, **{r: f_us[r] for r in ("actor", "inference", "learner")}}
        )
    return {
        "cpu_cost": statistics.median(cost),
        "busy": statistics.median(busy),
        "bare_busy_cores": statistics.median(u * r / 1e6 for u, r in zip(bare_cpu, bare_rates)),
        "extra_us": {role: statistics.median(e[role] for e in extra) for role in extra[0]},
    }


def _frames_per_cpu_s(render, seconds: float) -> float:
    """Frames per CPU-second of this process (all its threads: a software GL's too)."""
    render()  # first frame: context and buffers
    n, c0, t0 = 0, time.process_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        render()
        n += 1
    return n / max(time.process_time() - c0, 1e-9)


def render_part(task: str, sizes: list[int], seconds: float, repeats: int) -> dict:
    importlib.import_module("rlfleet.envs.metaworld")  # chooses MuJoCo's GL backend before mujoco loads
    import mujoco

    from rlfleet.envs.api import EnvConfig
    from rlfleet.envs.registry import make_env

    out: dict[str, Any] = {}
    for size in sizes:
        env = make_env(EnvConfig(name="metaworld", task=task, image_size=size), 1)
        env.reset()
        inner = env._envs[0]  # noqa: SLF001  (the MuJoCo model and data the renderer draws)
        ours = env._renderers[0]  # noqa: SLF001
        # MuJoCo's renderer on the same model (rlfleet's scene settings) and one with MuJoCo's defaults
        bare = mujoco.Renderer(inner.model, size, size)
        bare.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        bare.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        camera = ours._camera  # noqa: SLF001

        def bare_frame(r=bare, data=inner.data, cam=camera) -> np.ndarray:
            r.update_scene(data, camera=cam)
            return r.render()

        runs: dict[str, list[float]] = {"rlfleet": [], "mujoco": []}
        for _ in range(repeats):
            runs["mujoco"].append(_frames_per_cpu_s(bare_frame, seconds))
            runs["rlfleet"].append(_frames_per_cpu_s(lambda e=env: e.render_one(0), seconds))
        bare.close()
        env.close()
        defaults = _mujoco_defaults_fps(task, size, seconds)
        ratios = [o / b for o, b in zip(runs["rlfleet"], runs["mujoco"])]
        out[f"{size}px"] = {
            "frames_per_cpu_s": runs,
            "rlfleet/mujoco": statistics.median(ratios),
            "rlfleet/mujoco_repeats": ratios,
            "mujoco_defaults_frames_per_cpu_s": defaults,
        }
        print(
            f"[render] {size:3d} px: rlfleet {statistics.median(runs['rlfleet']):7.0f}  mujoco.Renderer "
            f"{statistics.median(runs['mujoco']):7.0f}  (MuJoCo defaults {defaults:6.0f}) frames per CPU-second",
            flush=True,
        )
    return out


def _mujoco_defaults_fps(task: str, size: int, seconds: float) -> float:
    """mujoco.Renderer with MuJoCo's default quality on a fresh copy of the task's model."""
    import mujoco

    from rlfleet.envs.api import EnvConfig
    from rlfleet.envs.registry import make_env

    env = make_env(EnvConfig(name="metaworld", task=task), 1)
    env.reset()
    inner = env._envs[0]  # noqa: SLF001
    inner.model.vis.global_.offwidth = max(inner.model.vis.global_.offwidth, size)
    inner.model.vis.global_.offheight = max(inner.model.vis.global_.offheight, size)
    r = mujoco.Renderer(inner.model, size, size)
    cam = inner.model.camera("corner").id

    def frame() -> np.ndarray:
        r.update_scene(inner.data, camera=cam)
        return r.render()

    fps = _frames_per_cpu_s(frame, seconds)
    r.close()
    env.close()
    return fps


def _summary_lines(results: dict) -> list[str]:
    lines = []
    for part in ("state", "pixels"):
        if part in results:
            r = results[part]
            lines.append(
                f"{part:6s} fleet sampling / bare = {r['sampling/bare']:.2f} (aim >= {AIMS[part]['sampling']})   "
                f"fleet training / bare = {r['training/bare']:.2f} (aim >= {AIMS[part]['training']})   "
                f"env-worker CPU per step, fleet / bare = {r['worker_cpu_per_step_sampling/bare']:.2f}"
            )
            for kind in ("sampling", "training"):
                why = r[f"{kind}/why"]
                roles = ", ".join(f"{role} {us:+.0f}" for role, us in why["extra_us"].items())
                lines.append(
                    f"       {kind:8s} = CPU cost {why['cpu_cost']:.2f} x busy {why['busy']:.2f}; "
                    f"CPU us per env step beyond the bare loop's: {roles}"
                )
    for size, r in results.get("render", {}).items():
        lines.append(
            f"render {size:>5s} rlfleet / mujoco.Renderer = {r['rlfleet/mujoco']:.2f} (aim >= {AIMS['render']})"
        )
    return lines


def report(path: Path) -> int:
    """The summary of an earlier run's JSON; the ratios' split is computed from it if missing."""
    results = json.loads(path.read_text())
    for part in ("state", "pixels"):
        r = results.get(part)
        if r is None:
            continue
        runs, cpu = r["env_steps_per_s"], r["cpu_us_per_env_step"]
        for kind in ("sampling", "training"):
            if f"{kind}/why" not in r:
                r[f"{kind}/why"] = decompose(runs["bare"], cpu["bare"], runs[kind], cpu[kind])
    print(f"{path} ({results.get('date', '?')}, {results.get('machine', '?')}):")
    print("\n".join(_summary_lines(results)))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run")
    p.add_argument(
        "--seconds", type=float, default=30.0, help="per measurement: bare loop, fleet window (render: a quarter)"
    )
    p.add_argument(
        "--warmup", type=float, default=15.0, help="a fleet's seconds after its first env step before its window"
    )
    p.add_argument("--repeats", type=int, default=3, help="alternating repeats; ratios are their median")
    p.add_argument("--render-sizes", type=int, nargs="+", default=[64, 224])
    p.add_argument("--render-task", default="reach-v3")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--report", metavar="FILE", help="only print the summary of an earlier --json")
    p.add_argument("overrides", nargs="*", help="recipe overrides for the state and pixels fleets")
    args = p.parse_args()
    if args.report:
        return report(Path(args.report))
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()}, {mp.cpu_count()} CPUs",
        "command": " ".join(sys.argv),
    }
    render_seconds = max(2.0, args.seconds / 4)
    for part in args.only:
        if part == "render":
            results["render"] = render_part(args.render_task, args.render_sizes, render_seconds, args.repeats)
        else:

            def keep(summary: dict, part: str = part) -> None:
                results[part] = summary
                if args.json:  # after every repeat: a run cut short keeps what it measured
                    Path(args.json).write_text(json.dumps(results, indent=2))

            results[part] = fleet_part(part, args.overrides, args.seconds, args.warmup, args.repeats, keep)
    print("\n".join(["", f"ratios (median of {args.repeats} alternating repeats):", *_summary_lines(results)]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
