"""Measure MetaWorldEnv throughput (env steps/s, one process) with random actions.

.venv/bin/python bench/env_step_rate.py                       # reach-v3, 8 envs, K=1, ~5 s
.venv/bin/python bench/env_step_rate.py --task MT10 --num-envs 10
"""

import argparse
import time

import numpy as np

from rlfleet.envs import EnvConfig, make_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="reach-v3")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--chunk-size", type=int, default=1)
    parser.add_argument("--max-episode-steps", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    cfg = EnvConfig(task=args.task, chunk_size=args.chunk_size, max_episode_steps=args.max_episode_steps)
    t0 = time.perf_counter()
    env = make_env(cfg, args.num_envs)
    env.reset()
    build_s = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    shape = (args.num_envs, args.chunk_size, env.spec.action_dim)
    steps = episodes = 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        result = env.chunk_step(rng.uniform(-1.0, 1.0, size=shape).astype(np.float32))
        steps += args.num_envs * args.chunk_size
        episodes += int(result.episode_done.sum())
    elapsed = time.perf_counter() - start
    env.close()

    print(
        f"task={args.task} num_envs={args.num_envs} K={args.chunk_size} "
        f"max_episode_steps={args.max_episode_steps}: {steps / elapsed:,.0f} env steps/s "
        f"({steps} steps, {episodes} episodes in {elapsed:.1f} s; build+reset {build_s:.1f} s)"
    )


if __name__ == "__main__":
    main()
