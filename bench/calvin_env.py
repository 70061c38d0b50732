"""Measure the CALVIN-style playtable: env steps/s (1 env, one process) and scripted-expert chain success.

    .venv/bin/python bench/calvin_env.py --seconds 10                 # steps/s, state-only and 64 px
    .venv/bin/python bench/calvin_env.py --experts 50 --variants ABCD  # expert success on 50 eval chains

Steps/s are reported per wall-clock second and per CPU second of this process (the second is
what the machine gives when it is not shared). Expert runs execute chain i of the pool on
variant variants[i % len(variants)] with seed `--first + i`, so a run is reproducible.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.calvin.config import CalvinEnvConfig
from rlfleet.envs.calvin.env import SUBTASK_STEPS, CalvinEnv


def step_rate(image_size: int, seconds: float, seed: int = 0) -> tuple[float, float]:
    """(wall, cpu) env steps per second with uniformly random actions, one env, K = 1."""
    env = CalvinEnv(EnvConfig(name="calvin", task="A", image_size=image_size, max_episode_steps=5 * SUBTASK_STEPS), 1)
    env.reset(np.array([seed]))
    rng = np.random.default_rng(seed)
    steps = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        env.chunk_step(rng.uniform(-1, 1, (1, 1, 7)).astype(np.float32))
        steps += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    env.close()
    return steps / wall, steps / cpu


def expert_chains(n: int, variants: str, pool: str, first: int) -> dict:
    """Run the scripted expert on `n` pool chains; chain and per-subtask success counts."""
    envs = {
        v: CalvinEnv(CalvinEnvConfig(name="calvin", task=v, pool=pool, max_episode_steps=5 * SUBTASK_STEPS), 1)
        for v in variants
    }
    tried: collections.Counter = collections.Counter()
    solved: collections.Counter = collections.Counter()
    progress = []
    failures = []
    steps = 0
    start = time.perf_counter()
    for i in range(n):
        variant = variants[i % len(variants)]
        env = envs[variant]
        env.reset(np.array([first + i]))
        chain = env.current_chains()[0]
        while True:
            res = env.chunk_step(env.expert_actions()[:, None])
            steps += 1
            if res.episode_done[0]:
                break
        done = int(env.last_chain_progress[0])
        progress.append(done)
        for j, name in enumerate(chain.subtasks[: min(done + 1, len(chain.subtasks))]):
            tried[name] += 1
            solved[name] += j < done
        if done < len(chain.subtasks):
            failures.append((first + i, variant, chain.subtasks[done]))
    for env in envs.values():
        env.close()
    return {
        "progress": progress,
        "tried": tried,
        "solved": solved,
        "failures": failures,
        "steps": steps,
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="per step-rate measurement")
    parser.add_argument("--experts", type=int, default=0, help="number of expert chains to run (0: skip)")
    parser.add_argument("--variants", default="ABCD")
    parser.add_argument("--pool", default="eval", choices=("train", "eval"))
    parser.add_argument("--first", type=int, default=0, help="seed (pool index) of the first chain")
    args = parser.parse_args()

    if args.seconds > 0:
        for size in (0, 64):
            wall, cpu = step_rate(size, args.seconds)
            label = "state-only" if size == 0 else f"{size} px"
            print(f"{label}: {wall:,.0f} env steps/s wall, {cpu:,.0f} per CPU second (1 env, random actions)")
    if args.experts:
        r = expert_chains(args.experts, args.variants, args.pool, args.first)
        prog = np.array(r["progress"])
        print(
            f"expert: {np.mean(prog == 5):.1%} of {len(prog)} {args.pool} chains fully solved "
            f"(seeds {args.first}..{args.first + len(prog) - 1}, variants {args.variants}); "
            f"mean subtasks done {prog.mean():.2f}; "
            f"{r['steps'] / r['seconds']:,.0f} env steps/s incl. expert"
        )
        print("  completed k of 5: " + ", ".join(f"{k}: {int(np.sum(prog >= k))}" for k in range(1, 6)))
        for name in sorted(r["tried"]):
            print(f"  {name}: {r['solved'][name]}/{r['tried'][name]}")
        for seed, variant, name in r["failures"]:
            print(f"  failed: seed {seed} variant {variant} at {name}")


if __name__ == "__main__":
    main()
