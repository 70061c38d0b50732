"""tiny_oft's deterministic decoders on the SFT starts of a recipe, over SFT seeds.

    python bench/decoders.py metaworld_quickstart_tinyoft --sft-seeds 0 1 2 --episodes 50

For each SFT seed S it builds (or reuses from cache/) the recipe's SFT checkpoint with
`sft.seed=S`, exactly as `rlfleet train` bootstraps it, then evaluates that one checkpoint on the
held-out validation episodes (`eval.validation_seed` up, the same episodes for every decoder; a
decoder is chosen by looking at success, so never on the test episodes results report: `--split
test` only to re-measure a choice already made) with each decoder of `policy.decode`
(`TinyOFTPolicy.decode`). Prints a table per task and writes `--json`; the paired difference to
argmax is reported as mean +- standard error over the SFT seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce import mean_se  # noqa: E402  (a sibling script, not a package)

from rlfleet.policies.vla.backbone import OFT_DECODERS  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key=value) for the SFT start")
    p.add_argument("--sft-seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--episodes", type=int, default=50, help="held-out episodes per task")
    p.add_argument("--split", choices=["validation", "test"], default="validation", help="held-out split to play")
    p.add_argument("--decoders", nargs="+", choices=OFT_DECODERS, default=list(OFT_DECODERS))
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    from rlfleet.config import load_config
    from rlfleet.envs.registry import task_list
    from rlfleet.eval.episodes import evaluate_policy
    from rlfleet.eval.splits import eval_env_config, eval_seed_range
    from rlfleet.policies.checkpoint_io import load_checkpoint
    from rlfleet.runs.bootstrap import ensure_sft_checkpoint

    results: dict[str, dict[str, dict[str, float]]] = {}  # seed -> decoder -> task -> success
    for seed in args.sft_seeds:
        cfg = load_config(args.recipe, [*args.overrides, f"sft.seed={seed}"])
        ckpt = ensure_sft_checkpoint(cfg, progress=False)
        cfg.eval.episodes_per_task = args.episodes
        env = eval_env_config(cfg, args.split)
        first = eval_seed_range(cfg, len(task_list(env)), args.split).start  # the start check: splits apart
        results[str(seed)] = {}
        for decoder in args.decoders:
            policy, _ = load_checkpoint(ckpt, overrides={"decode": decoder})
            t0 = time.monotonic()
            success = evaluate_policy(policy, env, args.episodes, seed=first, progress=False)
            results[str(seed)][decoder] = success
            mean = 100 * statistics.fmean(success.values())
            print(f"SFT seed {seed} ({ckpt}), {decoder}: mean {mean:.1f}% ({time.monotonic() - t0:.0f} s)", flush=True)
    print("\n" + "\n".join(_table(results, args.decoders)))
    if args.json:
        out = {"command": " ".join(sys.argv), "split": args.split, "success": results}
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def _mean_se(values: list[float]) -> str:
    mean, se = mean_se(values)
    return f"{mean:.1f} +- {se:.1f}"


def _table(results: dict, decoders: list[str]) -> list[str]:
    """Markdown: per SFT seed and decoder, success per task and mean (%), then mean +- se over seeds."""
    tasks = list(next(iter(next(iter(results.values())).values())))
    lines = [
        "| SFT seed | decoder | " + " | ".join(tasks) + " | mean |",
        "|---|---|" + "---:|" * (len(tasks) + 1),
    ]
    means: dict[str, list[float]] = {d: [] for d in decoders}
    for seed, by_decoder in results.items():
        for d in decoders:
            s = by_decoder[d]
            means[d].append(100 * statistics.fmean(s.values()))
            cells = " | ".join(f"{100 * s[t]:.0f}" for t in tasks)
            lines.append(f"| {seed} | {d} | {cells} | {means[d][-1]:.1f} |")
    lines.append("")
    for d in decoders:
        gain = [m - a for m, a in zip(means[d], means[decoders[0]])]
        lines.append(f"- {d}: mean {_mean_se(means[d])}%; against {decoders[0]} {_mean_se(gain)} points")
    return lines


if __name__ == "__main__":
    sys.exit(main())
