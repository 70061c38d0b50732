"""Inference speed of the tiny VLA policies on one CPU thread: `act` samples/s at batch 1, 8, 32.

One thread because an inference server shares the machine with env workers; the ratio
batch32/batch1 (same process, same thread count) says how much batching buys per sample.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlfleet.envs.api import encode_instructions
from rlfleet.policies.vla import VLA_POLICIES, VLAConfig

STATE_DIM = 39  # MetaWorld
BATCHES = (1, 8, 32)


def make_obs(batch: int, image_size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    texts = ["push the puck to the goal", "open the drawer"]
    return {
        "main_images": torch.randint(0, 256, (batch, image_size, image_size, 3), dtype=torch.uint8, generator=g),
        "states": torch.randn(batch, STATE_DIM, generator=g),
        "instructions": torch.from_numpy(encode_instructions([texts[i % 2] for i in range(batch)])),
    }


def samples_per_s(policy: torch.nn.Module, batch: int, image_size: int, repeats: int, calls: int) -> float:
    """Median over `repeats` of (batch * calls) / time for `calls` back-to-back act calls."""
    obs = make_obs(batch, image_size)
    for _ in range(3):  # warmup: allocator, oneDNN kernel selection, tokenizer cache
        policy.act(obs)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            policy.act(obs)
        rates.append(batch * calls / (time.perf_counter() - t0))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default="tiny_oft,tiny_pi0")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--action-dim", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"act() samples/s, {args.threads} thread(s), {args.image_size}x{args.image_size} images, "
        f"K={args.chunk}, D={args.action_dim}, median of {args.repeats} x {args.calls} calls"
    )
    print(
        f"{'policy':<10} {'params':>8} "
        + " ".join(f"{'b=' + str(b):>9}" for b in BATCHES)
        + f" {'ms/call b=32':>13} {'b32/b1':>7}"
    )
    for name in args.policies.split(","):
        cfg = VLAConfig(name=name)
        policy = VLA_POLICIES[name](STATE_DIM, args.action_dim, args.chunk, cfg, args.image_size).eval()
        rates = {b: samples_per_s(policy, b, args.image_size, args.repeats, args.calls) for b in BATCHES}
        params = sum(p.numel() for p in policy.parameters())
        print(
            f"{name:<10} {params:>8} "
            + " ".join(f"{rates[b]:>9.1f}" for b in BATCHES)
            + f" {1000 * 32 / rates[32]:>13.2f} {rates[32] / rates[1]:>7.1f}"
        )


if __name__ == "__main__":
    main()
