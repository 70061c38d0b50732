"""Can tiny_oft's image encoder read a MetaWorld task's goal from one camera frame?

Renders the first frame of `--frames` episodes (one goal each), trains the policy's own CNN image
encoder plus a small head to regress the goal position (`states[36:39]`) from the frame alone on
the first `--train` goals, and reports on the others how often the prediction lands within
`--radius` of the goal (reach-v3's success radius is 0.05 m), beside the best constant guess
(the training goals' median point). A read-out far above the constant guess means the frames carry
the goal and the encoder can extract it; what a policy learns from demos is a separate question.

    python bench/metaworld_goal_readout.py --task reach-v3
    python bench/metaworld_goal_readout.py --task reach-v3 --marker 0.05 --train 50
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlfleet.envs.metaworld import MetaWorldEnv
from rlfleet.envs.metaworld.config import MetaWorldEnvConfig
from rlfleet.envs.metaworld.env import GOAL
from rlfleet.policies.vla.backbone import CNN_GRID, CNNImageEncoder


def render_goals(task: str, frames: int, image_size: int, marker: float) -> tuple[np.ndarray, np.ndarray]:
    """First frames [N, H, W, 3] and goals [N, 3] of `frames` episodes (reset seeds 0..N-1)."""
    cfg = MetaWorldEnvConfig(task=task, image_size=image_size, goal_marker_size=marker)
    images, goals = [], []
    with MetaWorldEnv(cfg, 1) as env:
        for seed in range(frames):
            obs = env.reset(np.array([seed]))
            images.append(obs["main_images"][0])
            goals.append(obs["states"][0, GOAL])
    return np.stack(images), np.stack(goals).astype(np.float32)


class GoalReadout(nn.Module):
    """The policy's CNN image encoder, its 16 tokens flattened into an MLP -> goal xyz."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.encoder = CNNImageEncoder(dim)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(CNN_GRID * CNN_GRID * dim, 256), nn.GELU(), nn.Linear(256, 3))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(images))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="reach-v3")
    p.add_argument("--frames", type=int, default=3000, help="episodes rendered (one goal each)")
    p.add_argument("--train", type=int, default=2500, help="goals trained on; the rest are held out")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--marker", type=float, default=0.0, help="env.goal_marker_size (0: the goal site as shipped)")
    p.add_argument("--steps", type=int, default=3000, help="Adam steps, batches of 64")
    p.add_argument("--radius", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not 0 < args.train < args.frames:
        p.error(f"--train must be in (0, --frames={args.frames}), got {args.train}")

    t0 = time.perf_counter()
    images, goals = render_goals(args.task, args.frames, args.image_size, args.marker)
    print(f"rendered {len(images)} first frames in {time.perf_counter() - t0:.0f} s")
    torch.manual_seed(args.seed)
    x, y = torch.from_numpy(images), torch.from_numpy(goals)
    mu, sd = y[: args.train].mean(0), y[: args.train].std(0)
    model = GoalReadout()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    t0 = time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, args.train, (64,))
        loss = F.mse_loss(model(x[idx]), (y[idx] - mu) / sd)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 500 == 0:
            print(f"step {step + 1}/{args.steps}: normalised train loss {loss.item():.3f}", flush=True)
    with torch.no_grad():
        pred = model(x[args.train :]) * sd + mu
    err = (pred - y[args.train :]).norm(dim=1)
    const = (y[args.train :] - y[: args.train].median(0).values).norm(dim=1)
    held_out = len(err)
    print(
        f"{args.task} marker={args.marker} train={args.train} goals, {held_out} held out "
        f"({time.perf_counter() - t0:.0f} s of training): within {args.radius * 100:g} cm "
        f"{(err < args.radius).float().mean() * 100:.1f}% (median error {err.median() * 100:.1f} cm); "
        f"the best constant guess {(const < args.radius).float().mean() * 100:.1f}% "
        f"(median error {const.median() * 100:.1f} cm)"
    )


if __name__ == "__main__":
    main()
