"""Periodic evaluation during RL: a quickstart-like fleet run writes eval/* curves (and videos) to TensorBoard."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TASKS = "reach-v3,button-press-topdown-v3"


def test_quickstart_like_run_writes_eval_curves_to_tensorboard(tmp_path):
    run = tmp_path / "run"
    # the quickstart recipe (tiny_oft on 64 px pixels) from fresh weights, shrunk to a few updates
    overrides = [
        f"env.task={TASKS}",
        "env.max_episode_steps=16",
        "demos.bootstrap=false",
        "eval.before=false",
        "actor.num_envs=4",
        "actor.num_workers=1",
        "actor.rollout_len=4",
        "learner.batch_samples=32",
        "runner.total_env_steps=640",
        "runner.max_wall_seconds=0",
        "runner.checkpoint_every=100",
        "algorithm.critic_warmup_updates=0",
        "algorithm.lr_warmup_updates=0",
        "algorithm.kl_beta=0.0",
        "eval.episodes_per_task=1",
        "eval.every_updates=2",
        "eval.every_seconds=0",
        "eval.periodic_episodes_per_task=1",
        "eval.video_cfg.save_video=true",
        "eval.video_cfg.tensorboard=true",
        "eval.video_cfg.info_overlay=false",
        f"runner.logger.log_path={run}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "train", "metaworld_quickstart_tinyoft", *overrides],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "eval/success_once",
        "eval/elapsed_s",
        "eval/reach-v3/success_once",
        "eval/button-press-topdown-v3/success_once",
    } <= tags
    curve = acc.Scalars("eval/success_once")
    assert len(curve) == summary["updates"] // 2  # every second update
    assert all(0.0 <= e.value <= 1.0 for e in curve)
    assert [e.step for e in curve] == sorted(e.step for e in curve) and curve[-1].step <= summary["env_steps"]
    # the mean is the mean of the per-task curves at each step
    per_task = [acc.Scalars(f"eval/{t}/success_once") for t in TASKS.split(",")]
    for k, e in enumerate(curve):
        assert e.value == pytest.approx(sum(p[k].value for p in per_task) / len(per_task))
    assert {"eval/video/reach-v3", "eval/video/button-press-topdown-v3"} <= set(acc.Tags()["images"])
    gif = acc.Images("eval/video/reach-v3")[0]
    assert gif.encoded_image_string[:6] in (b"GIF87a", b"GIF89a") and gif.width >= 256
    assert list((run / "periodic_eval" / "update_000002" / "videos" / "reach-v3").glob("ep0_*.mp4"))
