"""hf_oft (a transformers backbone, LoRA, adapter-only weight versions) through the fleet against
tiny_oft beside it: the quickstart's settings (20 pixel envs, 5 tasks, 64 px, chunk 8), PPO
training, freshly initialised weights (they cost what trained ones do), alternating repeats.

A fleet's rate is its actor's env-step counter over `--seconds`, `--warmup` s after its first env
step (bench/overhead.py's window, with every role's CPU us per env step); the ratio is the median
over repeats of hf_oft / tiny_oft of the same repeat.

    python bench/hf_fleet.py [--seconds 30 --warmup 20 --repeats 3 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import fleet_window  # noqa: E402
from throughput import FLEET_OVERRIDES  # noqa: E402

RECIPES = {"tiny_oft": "metaworld_quickstart_tinyoft", "hf_oft": "metaworld_quickstart_hf_oft_cpu"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in RECIPES}
    cpu: dict[str, list[dict]] = {name: [] for name in RECIPES}
    for r in range(args.repeats):
        for name, recipe in RECIPES.items():
            out = fleet_window(recipe, list(FLEET_OVERRIDES), args.seconds, args.warmup, train=True)
            if "error" in out:
                raise RuntimeError(f"{recipe}: {out['error']}")
            rates[name].append(out["env_steps_per_s_wall"])
            cpu[name].append(out["us_per_env_step"])
        print(f"repeat {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f} env steps/s" for n in RECIPES), flush=True)
    ratio = statistics.median(h / t for h, t in zip(rates["hf_oft"], rates["tiny_oft"]))
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
        "env_steps_per_s": rates,
        "us_per_env_step": cpu,
        "hf_over_tiny": ratio,
        "env_step_count": "simulated",  # substeps that ran (issue 50; earlier reports: K per chunk)
    }
    print(
        f"training env steps/s, median of {args.repeats}: tiny_oft {statistics.median(rates['tiny_oft']):.0f}, "
        f"hf_oft {statistics.median(rates['hf_oft']):.0f}; hf_oft / tiny_oft {ratio:.2f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
