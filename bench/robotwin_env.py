"""Measure the RoboTwin-style env per task: expert success on seed-file episodes, state-only step rate, render rate.

    nice -n 15 .venv/bin/python bench/robotwin_env.py                       # all tasks, clean, ~2 min
    nice -n 15 .venv/bin/python bench/robotwin_env.py --tasks click_bell --setting randomized --episodes 50
    nice -n 15 .venv/bin/python bench/robotwin_env.py --render 224 --tasks place_empty_cup   # needs Vulkan

Expert success runs the scripted expert (chunk of 1) on the first N seeds of the chosen split; the
step rate uses random actions in one env (auto-resetting every 100 steps) with chunks of 10; the
render rate times head-camera frames alone (update_render + take_picture + readback).
"""

import argparse
import time

import numpy as np

from rlfleet.envs import EnvConfig
from rlfleet.envs.robotwin.env import ACTION_DIM, RoboTwinEnv
from rlfleet.envs.robotwin.tasks import TASKS


def expert_success(item: str, episodes: int, max_steps: int) -> tuple[float, float]:
    """(success rate, mean steps of successful episodes) of the expert on seeds 0..episodes-1 of `item`."""
    env = RoboTwinEnv(EnvConfig(name="robotwin", task=item, max_episode_steps=max_steps, reward_type="success"), 1)
    wins, lengths = 0, []
    for ep in range(episodes):
        env.reset(np.array([ep]))
        for t in range(max_steps):
            res = env.chunk_step(env.expert_actions()[:, None, :])
            if res.success[0]:
                wins += 1
                lengths.append(t + 1)
                break
    env.close()
    return wins / episodes, float(np.mean(lengths)) if lengths else float("nan")


def step_rate(item: str, seconds: float, image_size: int = 0) -> float:
    K = 10
    env = RoboTwinEnv(
        EnvConfig(name="robotwin", task=item, max_episode_steps=100, chunk_size=K, image_size=image_size), 1
    )
    env.reset()
    rng = np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.chunk_step(rng.uniform(-1, 1, (1, K, ACTION_DIM)).astype(np.float32))
        steps += K
    env.close()
    return steps / (time.perf_counter() - start)


def render_rate(item: str, size: int, frames: int = 60) -> float:
    env = RoboTwinEnv(EnvConfig(name="robotwin", task=item, image_size=size), 1)
    env.reset()
    scene = env._slots[0].scene  # the bench times the camera alone
    start = time.perf_counter()
    for _ in range(frames):
        scene.render()
    env.close()
    return frames / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--setting", default="clean")
    ap.add_argument("--split", default="train")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--render", type=int, default=0, help="also time head-camera frames at this size")
    args = ap.parse_args()
    print(f"{'task':24s} {'expert':>8s} {'steps':>6s} {'env steps/s':>12s}" + ("  frames/s" if args.render else ""))
    for task in args.tasks.split(","):
        item = f"{task}:{args.setting}:{args.split}"
        rate, length = expert_success(item, args.episodes, args.max_steps)
        line = f"{task:24s} {rate:8.0%} {length:6.0f} {step_rate(item, args.seconds):12.0f}"
        if args.render:
            line += f"  {render_rate(item, args.render):8.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
