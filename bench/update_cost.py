"""CPU cost of one PPO update of a pixel policy, by policy lag of its rows.

The learner skips the pre-update forward pass for rows acted with its current weights (lag 0:
the inference server's log-probs and values are kept). This measures what that saves on the
quickstart's update shape (8 segments of 10 envs x 20 chunks, 64 px, K = 8, 2 epochs of 4
minibatches, a KL penalty to a reference copy): CPU seconds per update with every row at lag 0
against every row at lag 1, alternated in one process (the lag-1 update is the baseline beside
it), median of `--repeats`. CPU seconds, not wall time, so a busy machine moves it little.

    python bench/update_cost.py                     # tiny_oft
    python bench/update_cost.py --policy tiny_pi0 --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from rlfleet.algorithms import PPOConfig
from rlfleet.envs.api import encode_instructions
from rlfleet.learner.trainer import Trainer
from rlfleet.policies.registry import make_policy
from rlfleet.wire.segment import Segment

S, D, K, SIZE, T, B, SEGMENTS = 39, 4, 8, 64, 20, 10, 8


def _segment(policy: torch.nn.Module, version: int, rng: np.random.Generator) -> Segment:
    obs = {
        "states": rng.normal(size=(T, B, S)).astype(np.float32),
        "main_images": rng.integers(0, 255, (T, B, SIZE, SIZE, 3), dtype=np.uint8),
        "instructions": np.broadcast_to(encode_instructions(["press the button"] * B), (T, B, 128)).copy(),
    }
    flat = {k: torch.from_numpy(v.reshape(T * B, *v.shape[2:])) for k, v in obs.items()}
    with torch.no_grad():
        out = policy.act(flat)
    extras = {k: v.numpy().reshape(T, B, *v.shape[1:]) for k, v in out.items() if k in policy.extra_outputs}
    return Segment(
        obs=obs,
        actions=out["actions"].numpy().reshape(T, B, K, D),
        logprobs=out["logprobs"].numpy().reshape(T, B, *out["logprobs"].shape[1:]).astype(np.float32),
        values=out["values"].numpy().reshape(T, B),
        rewards=(rng.random((T, B)) < 0.05).astype(np.float32),
        terminated=np.zeros((T, B), bool),
        truncated=np.zeros((T, B), bool),
        final_obs={k: np.zeros_like(v) for k, v in obs.items()},
        next_obs={k: v[-1] for k, v in obs.items()},
        versions=np.full(T, version, np.int64),
        task_ids=np.zeros(B, np.int64),
        env_steps=np.array(T * B * K, np.int64),
        ep_returns=np.zeros(0, np.float32),
        ep_lengths=np.zeros(0, np.int32),
        ep_success=np.zeros(0, bool),
        ep_task_ids=np.zeros(0, np.int64),
        extras=extras,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="tiny_oft", choices=["tiny_oft", "tiny_pi0", "tiny_pi05"])
    p.add_argument("--repeats", type=int, default=4, help="alternating pairs of updates; medians are reported")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the learner's share of the cores)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    policy = make_policy({"name": args.policy, "logprob_type": "action"}, S, D, K, image_size=SIZE)
    trainer = Trainer(
        policy,
        PPOConfig(update_epochs=2, num_minibatches=4, lr=3e-4, kl_beta=0.1, max_policy_lag=2),
        reference=copy.deepcopy(policy),
    )
    rng = np.random.default_rng(0)
    version = 5
    batches = {lag: [_segment(policy, version - lag, rng) for _ in range(SEGMENTS)] for lag in (0, 1)}
    trainer.step(batches[0], version=version)  # warm-up
    seconds: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(args.repeats):
        for lag, segments in batches.items():
            t = time.process_time()
            trainer.step(segments, version=version)
            seconds[lag].append(time.process_time() - t)
    steps = SEGMENTS * T * B * K
    med = {lag: float(np.median(v)) for lag, v in seconds.items()}
    for lag, v in seconds.items():
        print(
            f"lag {lag}: {med[lag]:.2f} CPU s per update ({1e6 * med[lag] / steps:.0f} us per env step);"
            f" runs {' '.join(f'{x:.2f}' for x in v)}"
        )
    print(f"{args.policy}: a lag-0 update costs {med[0] / med[1]:.2f} of a lag-1 update")


if __name__ == "__main__":
    main()
