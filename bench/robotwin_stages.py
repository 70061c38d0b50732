"""Where a policy fails on a staged RoboTwin task: how many held-out episodes reach each stage.

    nice -n 15 .venv/bin/python bench/robotwin_stages.py CHECKPOINT                  # place_empty_cup, 20 eval layouts
    nice -n 15 .venv/bin/python bench/robotwin_stages.py CHECKPOINT --split train --episodes 50

Runs the checkpoint's deterministic policy (chunks of its own size) on the first N layouts of the
split, one episode each, and counts the episodes whose `Task.progress()` reached each stage at some
step (place_empty_cup: held, lifted, over the coaster, lowered; then success). Tasks without stages
are refused.
"""

import argparse
from collections.abc import Callable

import numpy as np
import torch

from rlfleet.envs import EnvConfig
from rlfleet.envs.robotwin.env import RoboTwinEnv
from rlfleet.policies.checkpoint_io import load_checkpoint

STAGES = {0.25: "held", 0.5: "lifted", 0.75: "over the coaster", 1.0: "lowered"}


def stage_counts(
    checkpoint: str, task: str = "place_empty_cup", split: str = "eval", episodes: int = 20, max_steps: int = 160
) -> dict[str, int]:
    """Episodes (of `episodes`) in which the checkpoint's deterministic policy reached each stage, and `success`."""
    policy, cfg = load_checkpoint(checkpoint)
    policy.eval()
    chunk = int(cfg.get("chunk_size", 1))
    env_cfg = EnvConfig(
        name="robotwin",
        task=f"{task}:{split}",
        max_episode_steps=max_steps + chunk,  # no auto-reset inside the episode loop
        chunk_size=chunk,
        image_size=int(cfg.get("image_size", 0)),
        reward_type="success",
    )

    def act(obs: dict) -> np.ndarray:
        with torch.no_grad():
            batch = {k: torch.as_tensor(obs[k]) for k in policy.obs_keys}
            return policy.act(batch, deterministic=True)["actions"].numpy().astype(np.float32)

    env = RoboTwinEnv(env_cfg, 1)
    try:
        return follow_stages(env, act, episodes, max_steps)
    finally:
        env.close()


def follow_stages(env: RoboTwinEnv, act: Callable[[dict], np.ndarray], episodes: int, max_steps: int) -> dict[str, int]:
    """Run `act` (obs -> [1, K, A] actions) on `env`'s first `episodes` layouts; count the stages reached."""
    task = env._slots[0].task  # one env: its task's progress() is read after every chunk
    if task.progress() is None:
        raise SystemExit(f"{task.name} has no stages (Task.progress); staged tasks: place_empty_cup")
    counts = dict.fromkeys([*STAGES.values(), "success"], 0)
    for ep in range(episodes):
        obs = env.reset(np.array([ep]))
        best, success = 0.0, False
        for _ in range(0, max_steps, env.spec.chunk_size):
            res = env.chunk_step(act(obs))
            obs = res.obs
            best = max(best, task.progress() or 0.0)
            success |= bool(res.success[0])
            if success:
                break
        for threshold, name in STAGES.items():
            counts[name] += best >= threshold
        counts["success"] += success
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--task", default="place_empty_cup")
    ap.add_argument("--split", default="eval", choices=["train", "eval", "any"])
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--max-steps", type=int, default=160, help="episode limit (the recipes' 160)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    counts = stage_counts(args.checkpoint, args.task, args.split, args.episodes, args.max_steps)
    print(f"{args.task} ({args.split}, {args.episodes} episodes): " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
