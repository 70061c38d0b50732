"""Where a CALVIN-style policy's chains break: attempts and completions per subtask on the held-out
eval chains, evaluated the way `rlfleet train` evaluates (same eval seeds, deterministic policy;
`--sample`: sampled actions).

    .venv/bin/python bench/calvin_subtasks.py CHECKPOINT [--chains 50] [--recipe RECIPE] [--sample] [KEY=VALUE ...]

KEY=VALUE overrides are the run's own env and policy settings, e.g. `env.wrist_camera=true
policy.wrist_camera=true` for a checkpoint that reads the gripper camera. `--recipe` names the
run's recipe (default: the pixel one); a state-based checkpoint needs `--recipe calvin_d_d_ppo_mlp_cpu`.

A chain's subtasks are attempted in order until the first failure, so the subtask a chain stops at
is attempted and not completed; the ones before it are both. Each episode's record names the
eval-pool entry it played (its `scene`).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence

from rlfleet.config import load_config
from rlfleet.envs.calvin.chains import pool_entry
from rlfleet.runs.launcher import evaluate_start


def tally(chains: Sequence[Sequence[str]], done: Sequence[int]) -> dict[str, tuple[int, int, int, int]]:
    """Per subtask: (attempted, completed, chains it starts, chains it starts and completes)."""
    att: Counter[str] = Counter()
    ok: Counter[str] = Counter()
    first: Counter[str] = Counter()
    first_ok: Counter[str] = Counter()
    for subtasks, d in zip(chains, done, strict=True):
        for k, name in enumerate(subtasks[: d + 1]):
            att[name] += 1
            ok[name] += int(k < d)
        first[subtasks[0]] += 1
        first_ok[subtasks[0]] += int(d > 0)
    return {name: (att[name], ok[name], first[name], first_ok[name]) for name in att}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--chains", type=int, default=50, help="held-out eval chains (the recipes' final evaluation: 50)")
    p.add_argument("--recipe", default="calvin_d_d_ppo_tinypi0_cpu")
    p.add_argument("--sample", action="store_true", help="sampled actions instead of the deterministic policy")
    p.add_argument("overrides", nargs="*", help="the run's key=value overrides, e.g. env.wrist_camera=true")
    args = p.parse_intermixed_args(argv)  # overrides may follow --chains
    own = [f"policy.model_path={args.checkpoint}", f"eval.episodes_per_task={args.chains}"]
    cfg = load_config(args.recipe, [*args.overrides, *own])
    records: list[dict] = []
    evaluate_start(cfg, deterministic=not args.sample, episode_records=records)
    done = [int(round(r["return"])) for r in records]  # subtasks completed
    chains = [pool_entry("eval", r["scene"]).subtasks for r in records]  # scene: the eval pool entry played
    rows = tally(chains, done)
    mode = "sampled" if args.sample else "deterministic"
    print(f"{args.checkpoint} ({mode}): avg_num_subtasks {sum(done) / len(done):.2f} over {len(done)} eval chains")
    print("| subtask | attempted | completed | first of a chain | completed as first |\n|---|---:|---:|---:|---:|")
    for name, (a, o, f, fo) in sorted(rows.items(), key=lambda kv: (-kv[1][0], kv[0])):
        print(f"| {name} | {a} | {o} ({100 * o / a:.0f}%) | {f} | {fo} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
