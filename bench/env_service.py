"""Step rate of an env stepped in-process vs the same env behind EnvService (`remote://`).

Starts `rlfleet env-server` for the env in its own process, then steps B envs with random
actions for a few seconds each way, one chunk per call, alternating local and remote runs
`--repeats` times, and prints the best env steps/s of each (the least disturbed by other load on
the host) and their ratio.
With `--remote HOST:PORT` it measures only an already running server (e.g. the Node example).

    python bench/env_service.py --task reach-v3 --num-envs 8 --seconds 10
    python bench/env_service.py --remote 127.0.0.1:50070 --num-envs 16
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import make_env


def step_rate(cfg: EnvConfig, num_envs: int, seconds: float) -> float:
    """Env steps per second (num_envs x chunk_size per call) with uniform random actions."""
    with make_env(cfg, num_envs) as env:
        env.reset()
        rng = np.random.default_rng(0)
        shape = (num_envs, env.spec.chunk_size, env.spec.action_dim)
        steps, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            env.chunk_step(rng.uniform(-1, 1, shape).astype(np.float32))
            steps += num_envs * env.spec.chunk_size
        return steps / (time.monotonic() - t0)


def start_server(args: argparse.Namespace, folder: Path) -> tuple[subprocess.Popen, str]:
    addr_file = folder / "env.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet.cli",
            "env-server",
            "--env",
            args.env,
            "--task",
            args.task,
            "--address-file",
            str(addr_file),
            f"max_episode_steps={args.max_episode_steps}",
        ],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not addr_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("env-server did not start")
        time.sleep(0.1)
    return proc, json.loads(addr_file.read_text())["env"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="metaworld")
    p.add_argument("--task", default="reach-v3")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--chunk-size", type=int, default=1)
    p.add_argument("--max-episode-steps", type=int, default=150)
    p.add_argument("--seconds", type=float, default=10.0, help="per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--remote", help="measure only this running EnvService server (HOST:PORT)")
    args = p.parse_args()
    common = dict(task=args.task, chunk_size=args.chunk_size, max_episode_steps=args.max_episode_steps)
    result: dict[str, float] = {}
    if args.remote:
        remote = EnvConfig(name=f"remote://{args.remote}", **common)
        result["remote"] = max(step_rate(remote, args.num_envs, args.seconds) for _ in range(args.repeats))
    else:
        local = EnvConfig(name=args.env, **common)
        with tempfile.TemporaryDirectory() as tmp:
            proc, address = start_server(args, Path(tmp))
            remote = EnvConfig(name=f"remote://{address}", **common)
            try:
                rates = [
                    (step_rate(local, args.num_envs, args.seconds), step_rate(remote, args.num_envs, args.seconds))
                    for _ in range(args.repeats)
                ]
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=30)
        result["local"], result["remote"] = max(r[0] for r in rates), max(r[1] for r in rates)
        result["remote/local"] = result["remote"] / result["local"]
    print(
        json.dumps(
            {
                "env": args.remote or f"{args.env}:{args.task}",
                "num_envs": args.num_envs,
                "chunk_size": args.chunk_size,
                **{k: round(v, 3 if "/" in k else 1) for k, v in result.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
