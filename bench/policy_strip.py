"""A strip of frames of a policy before and after RL, as one PNG (the README's picture).

    python bench/policy_strip.py RUN_DIR --out docs/results/strip.png [--frames 6] [--seed 10000]

"Before" is the policy the run started from (`policy.model_path`, or fresh weights from
`runner.seed` as the run built them), "after" its last checkpoint. Each plays one held-out eval
episode (seed `--seed`, first task) rendered from the env's camera, also for a state-based policy
(it still reads only its states); the frames come from `rlfleet.eval.video`'s recorder, with its
task / step / success overlay and green (success) or red status bar.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image


def episode_frames(policy, env_cfg, seed: int, image_size: int) -> tuple[list[np.ndarray], bool]:
    """One deterministic episode of the first task: its video frames and whether it succeeded."""
    import imageio.v3 as iio

    from rlfleet.config import VideoConfig
    from rlfleet.eval.episodes import evaluate_policy

    env_cfg = dataclasses.replace(env_cfg, image_size=image_size, task=env_cfg.task.split(",")[0])
    with tempfile.TemporaryDirectory() as tmp:
        videos: list[Path] = []
        success = evaluate_policy(
            policy,
            env_cfg,
            1,
            seed=seed,
            video_cfg=VideoConfig(save_video=True),
            out_dir=tmp,
            progress=False,
            videos=videos,
        )
        return list(iio.imread(videos[0])), bool(next(iter(success.values())))


def strip(rows: list[tuple[str, list[np.ndarray]]], frames: int, side: int = 256) -> Image.Image:
    """Rows of `frames` evenly spaced frames (first and last included), each row titled on its left."""
    from PIL import Image, ImageDraw, ImageFont

    label_w, pad = 150, 4
    canvas = Image.new("RGB", (label_w + frames * (side + pad), len(rows) * (side + pad)), "white")
    draw = ImageDraw.Draw(canvas)
    try:
        font = ImageFont.load_default(size=18)
    except TypeError:  # Pillow < 10.1: fixed bitmap font
        font = ImageFont.load_default()
    for r, (title, video) in enumerate(rows):
        y = r * (side + pad)
        draw.multiline_text((8, y + side // 2 - 20), title, fill="black", font=font)
        picks = np.linspace(0, len(video) - 1, frames).round().astype(int)
        for c, k in enumerate(picks):
            tile = Image.fromarray(video[k]).resize((side, side), Image.NEAREST)
            canvas.paste(tile, (label_w + c * (side + pad), y))
    return canvas


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="a finished run folder (config.yaml, checkpoints/)")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--seed", type=int, default=10_000, help="eval episode seed (held out from training)")
    p.add_argument("--image-size", type=int, default=128, help="camera side in pixels for a state-based run")
    args = p.parse_args(argv)

    import torch

    from rlfleet.config import as_dict, config_from_yaml
    from rlfleet.envs.registry import build_env_config
    from rlfleet.policies.checkpoint_io import load_checkpoint, policy_from_config, read_model_config
    from rlfleet.wire.run_spec import read_run_spec

    run = Path(args.run_dir)
    cfg = config_from_yaml((run / "config.yaml").read_text())
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    env_cfg = build_env_config(as_dict(cfg.env)).held_out("test")
    size = cfg.env.image_size or args.image_size
    torch.manual_seed(cfg.runner.seed)  # the same fresh weights the run started from
    # the dims and the settings the run built its policy with: its run spec, else (a run from
    # before the spec) its latest checkpoint's config.json
    spec = read_run_spec(run)
    meta = read_model_config(str(latest)) if spec is None else {}
    state_dim, action_dim = (spec.state_dim, spec.action_dim) if spec else (meta["state_dim"], meta["action_dim"])
    settings = dict(spec.policy) if spec else meta["policy"]
    before = policy_from_config(settings, state_dim, action_dim, cfg.env.chunk_size, cfg.env.image_size)
    after, _ = load_checkpoint(str(latest))
    rows = []
    for name, policy in (("before RL", before), ("after RL", after)):
        frames, ok = episode_frames(policy, env_cfg, args.seed, size)
        rows.append((f"{name}\n{'success' if ok else 'fail'}", frames))
        print(f"{name}: {'success' if ok else 'fail'} in {len(frames)} frames")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    strip(rows, args.frames).save(out, optimize=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
