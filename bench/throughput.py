"""Throughput benchmark, all four measurements in one run on the same cores.

(a) limit: the same envs stepped with random actions in bare loops, one process per worker;
(b) fleet sampling: learner (consuming, not training) + inference server + actor;
(c) synchronous baseline: one process steps all envs, runs the policy, steps again;
(d) fleet training: the full fleet while PPO updates run.
Prints each in env steps/s and the ratios b/a, b/c and d/a.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _bare_loop(task: str, num_envs: int, offset: int, seconds: float, out: mp.Queue) -> None:
    from rlfleet.envs.api import EnvConfig
    from rlfleet.envs.registry import make_env

    env = make_env(EnvConfig(task=task), num_envs, env_offset=offset)
    env.reset()
    rng = np.random.default_rng(offset)
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        env.chunk_step(rng.uniform(-1, 1, (num_envs, 1, env.spec.action_dim)).astype(np.float32))
        steps += num_envs
    out.put(steps / (time.monotonic() - t0))
    env.close()


def limit(task: str, num_envs: int, workers: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_bare_loop, args=(task, num_envs // workers, w * (num_envs // workers), seconds, q))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    rates = [q.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return float(sum(rates))


def synchronous(task: str, num_envs: int, policy_cfg, seconds: float) -> float:
    """One process, the recipe's own policy: step all envs, infer, step."""
    import torch

    from rlfleet.envs.api import EnvConfig
    from rlfleet.envs.registry import make_env
    from rlfleet.policies.registry import make_policy

    torch.set_num_threads(1)
    env = make_env(EnvConfig(task=task), num_envs)
    policy = make_policy(policy_cfg, env.spec.state_dim, env.spec.action_dim, 1)
    obs = env.reset()
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        out = policy.act({"states": torch.from_numpy(obs["states"])})
        obs = env.chunk_step(out["actions"].numpy()).obs
        steps += num_envs
    env.close()
    return steps / (time.monotonic() - t0)


def fleet(recipe: str, overrides: list[str], seconds: float, consume_only: bool) -> float:
    from rlfleet.config import load_config
    from rlfleet.runs.launcher import train_local

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            recipe,
            [
                *overrides,
                f"runner.logger.log_path={tmp}/run",
                f"runner.max_wall_seconds={seconds}",
                "runner.total_env_steps=100000000",
                "eval.at_end=false",
                f"learner.consume_only={str(consume_only).lower()}",
            ],
        )
        summary = train_local(cfg)
    return float(summary["throughput_env_steps_per_s"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="metaworld_reach_ppo")
    p.add_argument("--seconds", type=float, default=20.0, help="per bare/synchronous measurement")
    p.add_argument(
        "--fleet-seconds",
        type=float,
        default=60.0,
        help="per fleet run, start-up included (throughput counts from the first full batch)",
    )
    p.add_argument("--json", help="also write the results here")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. actor.num_envs=32")
    args = p.parse_args()

    from rlfleet.config import load_config

    cfg = load_config(args.recipe, args.overrides)
    task, E, W = cfg.env.task, cfg.actor.num_envs * cfg.actor.num_actors, cfg.actor.num_workers * cfg.actor.num_actors
    print(f"recipe {args.recipe}: task {task}, {E} envs, {W} workers", flush=True)
    results = {}
    results["a_limit"] = limit(task, E, W, args.seconds)
    print(f"(a) bare env loop          {results['a_limit']:8.0f} env steps/s", flush=True)
    results["c_synchronous"] = synchronous(task, E, cfg.policy, args.seconds)
    print(f"(c) synchronous baseline   {results['c_synchronous']:8.0f} env steps/s", flush=True)
    results["b_fleet_sampling"] = fleet(args.recipe, args.overrides, args.fleet_seconds, consume_only=True)
    print(f"(b) fleet sampling         {results['b_fleet_sampling']:8.0f} env steps/s", flush=True)
    results["d_fleet_training"] = fleet(args.recipe, args.overrides, args.fleet_seconds, consume_only=False)
    print(f"(d) fleet training         {results['d_fleet_training']:8.0f} env steps/s", flush=True)
    a, b, c, d = (results[k] for k in ("a_limit", "b_fleet_sampling", "c_synchronous", "d_fleet_training"))
    results.update({"b/a": b / a, "b/c": b / c, "d/a": d / a})
    print(f"b/a = {b / a:.2f} (aim >= 0.8)   b/c = {b / c:.2f} (aim >= 1.5)   d/a = {d / a:.2f} (aim >= 0.6)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
