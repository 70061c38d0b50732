"""How near a CALVIN-style policy brings the hand to the named block: on the held-out eval chains
that begin with a block subtask (lift / push / rotate a colored block), the deterministic policy
(`--sample`: sampled actions) runs the first subtask, and per chain this reports the hand's closest
distance to that block and whether the subtask completed; over all chains, how far the hand moves
per action chunk (net displacement, median) and the share of chunks that end with it within 3 mm
of where it was (stalls).

    .venv/bin/python bench/calvin_reach.py CHECKPOINT [--chains 16] [--recipe RECIPE] [--sample] [KEY=VALUE ...]

`--recipe` names the run's recipe (default: the pixel one; `calvin_d_d_ppo_mlp_cpu` for a
state-based checkpoint).

Distances come from the `states` observation alone (tool centre point: robot_obs[0:3]; block
centres: scene_obs, 6 per block after the 6 fixture values), so they are what the policy could
read too. Chains are the eval pool's entries from `eval.seed` on, in order, that start with a
block subtask; a chain's first subtask ends when it completes or fails (360 env steps).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rlfleet.config import as_dict, load_config
from rlfleet.envs.calvin.chains import pool_entry, pool_size
from rlfleet.envs.calvin.layout import BLOCK_COLORS
from rlfleet.envs.calvin.scene import ROBOT_OBS_DIM
from rlfleet.envs.calvin.shaping import BLOCK_KINDS
from rlfleet.envs.calvin.subtasks import SUBTASKS
from rlfleet.envs.registry import build_env_config, make_env
from rlfleet.envs.run_shapes import probe_env_dims
from rlfleet.eval.episodes import obs_tensors
from rlfleet.eval.splits import eval_env_config, split_seed
from rlfleet.policies.checkpoint_io import policy_from_config

STALL_M = 0.003  # a chunk after which the hand is within this of where it was
FIXTURE_VALUES = 6  # scene_obs: slider, drawer, button, switch, bulb, led; then x y z and euler per block


def hand_to_block(state: np.ndarray, color: str) -> float:
    """Distance (m) from the tool centre point to the centre of block `color`, from one `states` row."""
    j = ROBOT_OBS_DIM + FIXTURE_VALUES + 6 * BLOCK_COLORS.index(color)
    return float(np.linalg.norm(state[:3] - state[j : j + 3]))


def block_first_seeds(first_seed: int, count: int, pool: str = "eval") -> list[int]:
    """The first `count` seeds from `first_seed` whose chain in `pool` (the split's: `EnvConfig.pool`)
    starts with a block subtask."""
    seeds, s = [], first_seed
    while len(seeds) < count:
        if s - first_seed >= pool_size(pool):
            raise ValueError(f"the {pool} pool has fewer than {count} chains that start with a block subtask")
        if SUBTASKS[pool_entry(pool, s % pool_size(pool)).subtasks[0]].kind in BLOCK_KINDS:
            seeds.append(s)
        s += 1
    return seeds


@torch.no_grad()
def reach(cfg, seeds: list[int], sample: bool = False) -> tuple[list[tuple[str, float, bool]], np.ndarray]:
    """(first subtask, closest hand-to-block distance, completed) per chain, and the hand's travel (m)
    over each chunk of the first subtasks."""
    torch.manual_seed(cfg.runner.seed)
    state_dim, action_dim = probe_env_dims(build_env_config(as_dict(cfg.env)))
    policy = policy_from_config(as_dict(cfg.policy), state_dim, action_dim, cfg.env.chunk_size, cfg.env.image_size)
    policy.eval()
    env = make_env(eval_env_config(cfg), len(seeds))
    try:
        obs = env.reset(np.array(seeds))
        first = list(env.current_subtasks())
        colors = [SUBTASKS[n].color for n in first]
        closest = np.array([hand_to_block(obs["states"][i], c) for i, c in enumerate(colors)])
        completed = np.zeros(len(seeds), bool)
        active = np.ones(len(seeds), bool)
        travel: list[float] = []
        while active.any():
            out = policy.act(obs_tensors(obs, policy.obs_keys), deterministic=not sample)
            res = env.chunk_step(out["actions"].numpy())
            now = env.current_subtasks()
            for i in np.flatnonzero(active):
                done = bool(res.episode_done[i])  # failed (or the chain was done); the env reset to a new chain
                state = (res.final_obs if done else res.obs)["states"][i]
                closest[i] = min(closest[i], hand_to_block(state, colors[i]))
                travel.append(float(np.linalg.norm(state[:3] - obs["states"][i][:3])))
                if done or now[i] != first[i]:  # else the first subtask goes on
                    completed[i], active[i] = (res.episode_return[i] >= 1) if done else True, False
            obs = res.obs
    finally:
        env.close()
    return [(first[i], float(closest[i]), bool(completed[i])) for i in range(len(seeds))], np.array(travel)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--chains", type=int, default=16, help="eval chains that start with a block subtask")
    p.add_argument("--recipe", default="calvin_d_d_ppo_tinypi0_cpu")
    p.add_argument("--sample", action="store_true", help="sampled actions instead of the deterministic policy")
    p.add_argument("overrides", nargs="*", help="the run's key=value overrides, e.g. env.wrist_camera=true")
    args = p.parse_intermixed_args(argv)
    cfg = load_config(args.recipe, [*args.overrides, f"policy.model_path={args.checkpoint}"])
    # the eval.split's chains from its first seed, as the run's evaluation plays them
    seeds = block_first_seeds(split_seed(cfg.eval), args.chains, eval_env_config(cfg).pool)
    rows, travel = reach(cfg, seeds, args.sample)
    dist = np.array([r[1] for r in rows])
    print(
        f"{args.checkpoint} ({'sampled' if args.sample else 'deterministic'}): {len(rows)} chains that start "
        f"with a block subtask; closest hand-to-block distance median {100 * np.median(dist):.1f} cm, within "
        f"5 cm on {int((dist < 0.05).sum())}, completed {sum(r[2] for r in rows)}; hand travel per chunk "
        f"median {1000 * np.median(travel):.1f} mm, {100 * np.mean(travel < STALL_M):.0f}% of "
        f"{len(travel)} chunks under {1000 * STALL_M:.0f} mm"
    )
    print("| first subtask | closest (cm) | completed |\n|---|---:|---|")
    for name, closest_m, ok in rows:
        print(f"| {name} | {100 * closest_m:.1f} | {'yes' if ok else 'no'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
