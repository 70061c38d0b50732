"""A pixel gymnasium env bare and through the fleet, in one run: env steps/s of `GymEnv` alone (one
process, random actions) and of `rlfleet train` with tiny_oft reading its 64 px frames.

.venv/bin/python bench/gym_pixels.py                                      # Reacher-v5, 8 envs
.venv/bin/python bench/gym_pixels.py --env gym:lerobot_env_so101:lerobot_env_so101/SO101PickCube-v0 \
    --max-episode-steps 96 --fleet-seconds 120 --quality env              # as the env ships its scene

Prints one JSON line: bare and fleet env steps/s (the actors' own count), and the render quality
(env.gym_render_quality).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rlfleet.envs import make_env
from rlfleet.envs.gymnasium_config import GymEnvConfig

RECIPE = """
defaults:
  - scale/cpu_vla
  - model/tiny_oft
  - algo/ppo_vla
demos:
  bootstrap: false
eval:
  before: false
  at_end: false
"""


def bare(cfg: GymEnvConfig, num_envs: int, seconds: float) -> float:
    env = make_env(cfg, num_envs)
    try:
        env.reset()
        rng = np.random.default_rng(0)
        shape = (num_envs, cfg.chunk_size, env.spec.action_dim)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.chunk_step(rng.uniform(-1.0, 1.0, size=shape).astype(np.float32))
            steps += num_envs * cfg.chunk_size
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def fleet(args: argparse.Namespace, folder: Path) -> float:
    recipe = folder / "gym_pixels.yaml"
    recipe.write_text(RECIPE)
    overrides = [
        f"env.name={args.env}",
        "env.image_size=64",
        f"env.chunk_size={args.chunk_size}",
        f"env.max_episode_steps={args.max_episode_steps}",
        f"env.gym_render_quality={args.quality}",
        f"actor.num_envs={args.num_envs}",
        f"learner.batch_samples={args.num_envs * 20}",
        f"runner.total_env_steps={args.fleet_steps}",
        f"runner.max_wall_seconds={args.fleet_seconds}",
        f"runner.logger.log_path={folder / 'run'}",
    ]
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "train", str(recipe), *overrides],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    if res.returncode != 0:
        raise SystemExit(res.stderr[-3000:])
    # the actors' own count (env steps taken / their stepping time): a slow env may end its wall
    # budget before a segment, and so before the learner counts any step
    rates = [
        float(line.rsplit("(", 1)[1].split()[0])
        for log in sorted((folder / "run" / "logs").glob("actor*.log"))
        for line in log.read_text().splitlines()
        if " done: " in line and "steps/s)" in line
    ]
    return sum(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="gym:Reacher-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--max-episode-steps", type=int, default=48)
    parser.add_argument("--quality", choices=["fast", "env"], default="fast")
    parser.add_argument("--seconds", type=float, default=10.0, help="of the bare measurement")
    parser.add_argument("--fleet-steps", type=int, default=6400, help="env steps of the fleet run")
    parser.add_argument("--fleet-seconds", type=float, default=0, help="wall budget of the fleet run (0: none)")
    args = parser.parse_args()
    cfg = GymEnvConfig(
        name=args.env,
        image_size=64,
        chunk_size=args.chunk_size,
        max_episode_steps=args.max_episode_steps,
        gym_render_quality=args.quality,
    )
    bare_rate = bare(cfg, args.num_envs, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        fleet_rate = fleet(args, Path(tmp))
    result = {"env": args.env, "quality": args.quality, "num_envs": args.num_envs, "image_size": 64}
    print(json.dumps({**result, "bare_env_steps_per_s": round(bare_rate, 1), "fleet_env_steps_per_s": fleet_rate}))


if __name__ == "__main__":
    main()
