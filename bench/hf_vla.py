"""The transformers VLA family's two claims, measured against a baseline run beside them.

1. The pi0 prefix cache: `hf_pi0` acting with the prefix computed once per act (the default)
   against the same policy recomputing it at every denoise step (`prefix_cache: false`), on the
   tiny config, CPU, one thread; median of --reps; the ratio is the speedup.
2. Adapter-only weight versions: the bytes one version carries (safetensors of the policy's
   state_dict, what the learner publishes) against the whole policy's weights: measured by
   publishing the tiny configs, computed for the real layouts (PaliGemma-3B, SmolVLM-256M) built on
   the `meta` device (shapes without memory) with LoRA rank 16.

    python bench/hf_vla.py [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from safetensors.torch import save as st_save

from rlfleet.envs.api import encode_instructions
from rlfleet.policies.hf.backbone import add_lora
from rlfleet.policies.registry import make_policy

STATE, ACTION, CHUNK, IMAGE = 39, 4, 5, 64
LORA16 = {
    "lora_rank": 16,
    "lora_alpha": 32.0,
    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def _obs(n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "main_images": torch.randint(0, 256, (n, IMAGE, IMAGE, 3), dtype=torch.uint8, generator=g),
        "states": torch.randn(n, STATE, generator=g),
        "instructions": torch.from_numpy(encode_instructions(["pick the red cube"] * n)),
    }


def prefix_cache(reps: int, batch: int, steps: int) -> dict:
    """Cached and uncached act, interleaved rep by rep (the machine's load drifts over both alike)."""
    policies = {}
    for cached in (True, False):
        torch.manual_seed(0)
        settings = {"name": "hf_pi0", "backbone": "builtin:tiny-paligemma", "expert_width": 32}
        settings.update({"lora_rank": 8, "num_denoise_steps": steps, "prefix_cache": cached})
        policies[cached] = make_policy(settings, STATE, ACTION, CHUNK, image_size=IMAGE).eval()
    obs = _obs(batch)
    times: dict[bool, list[float]] = {True: [], False: []}
    for p in policies.values():
        p.act(obs)  # warm-up
    for _ in range(reps):
        for cached, p in policies.items():
            t = time.perf_counter()
            p.act(obs)
            times[cached].append(1000 * (time.perf_counter() - t))
    ratios = [u / c for c, u in zip(times[True], times[False])]
    return {
        "batch": batch,
        "denoise_steps": steps,
        "cached_ms": statistics.median(times[True]),
        "uncached_ms": statistics.median(times[False]),
        "speedup": statistics.median(ratios),
        "speedup_range": [min(ratios), max(ratios)],
    }


def version_bytes(settings: dict, action_dim: int, chunk: int, image: int, meta: bool) -> dict:
    """Bytes of one full weight version (the policy's state_dict) against all of its weights.
    `lora_expert` is sized without its pi0_weights (which the meta device cannot read): the same
    adapters are put on the expert by hand."""
    if meta:
        lora_expert = settings.get("lora_expert", False)
        built = {k: v for k, v in settings.items() if k != "lora_expert"}
        with torch.device("meta"):
            p = make_policy(built, STATE, action_dim, chunk, image_size=image)
            if lora_expert:
                add_lora(p.expert.model, p.cfg)
                for name, q in p.expert.model.named_parameters():
                    q.requires_grad_("lora_" in name)
                p.cfg.lora_expert = True  # base_modules() then counts the expert's base as frozen
                p.record_frozen_base()
        sent = sum(t.numel() * t.element_size() for t in p.state_dict().values())
        how = "computed (meta device)"
    else:
        p = make_policy(settings, STATE, action_dim, chunk, image_size=image)
        sent = len(st_save({k: v.contiguous() for k, v in p.state_dict().items()}))
        how = "measured (safetensors bytes)"
    full = sum(t.numel() * t.element_size() for t in p.parameters())
    return {"policy": settings, "version_bytes": sent, "full_bytes": full, "share": sent / full, "how": how}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--skip-real", action="store_true", help="tiny configs only (no real layouts)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("RLFLEET_BACKBONES", os.path.join(tempfile.gettempdir(), "rlfleet-backbones"))
    result = {"prefix_cache": [prefix_cache(args.reps, b, 10) for b in (1, 8, 32)], "versions": []}
    tiny = {"backbone": "builtin:tiny-paligemma", "lora_rank": 8, "expert_width": 32}
    for name in ("hf_oft", "hf_pi0"):
        result["versions"].append(version_bytes({"name": name, **tiny}, ACTION, CHUNK, IMAGE, meta=False))
    if not args.skip_real:
        pg = {"backbone": "builtin:paligemma-3b-random", **LORA16}
        result["versions"].append(version_bytes({"name": "hf_oft", **pg}, 7, 8, 224, meta=True))
        pi0 = {"expert_width": 1024, "expert_mlp": 4096, "lora_expert": True}
        result["versions"].append(version_bytes({"name": "hf_pi0", **pg, **pi0}, 7, 50, 224, meta=True))
        smol = {"backbone": "builtin:smolvlm-256m-random", **LORA16}
        result["versions"].append(version_bytes({"name": "hf_oft", **smol}, 7, 8, 512, meta=True))
    for row in result["prefix_cache"]:
        lo, hi = row["speedup_range"]
        print(
            f"prefix cache, batch {row['batch']}, {row['denoise_steps']} steps: "
            f"{row['cached_ms']:.1f} ms cached, {row['uncached_ms']:.1f} ms uncached, "
            f"{row['speedup']:.2f}x (range {lo:.2f}-{hi:.2f} over {args.reps} interleaved reps)"
        )
    for row in result["versions"]:
        p = row["policy"]
        print(
            f"{p['name']} on {p['backbone']}: {row['version_bytes'] / 1e6:.2f} MB per version of "
            f"{row['full_bytes'] / 1e6:.1f} MB ({100 * row['share']:.2f}%, {row['how']})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
