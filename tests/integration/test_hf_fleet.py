"""The transformers VLA family through the whole pipeline: scripted demos, SFT of hf_oft (a tiny
random PaliGemma with LoRA adapters) and PPO through the learner, the inference server and an
actor as real processes; the checkpoints hold adapters and heads, not the base."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors import safe_open

pytest.importorskip("transformers")
pytest.importorskip("peft")

RUN = [
    "env.task=reach-v3,button-press-topdown-v3",
    "env.chunk_size=4",
    "env.max_episode_steps=80",  # the scripted experts succeed within it (demos keep successes)
    "demos.bootstrap=true",
    "demos.episodes_per_task=2",
    "demos.num_workers=1",
    "sft.steps=10",
    "sft.batch_size=8",
    "actor.num_envs=4",
    "actor.num_workers=1",
    "actor.pipeline_stage_num=2",
    "actor.rollout_len=4",
    "learner.batch_samples=16",
    "runner.total_env_steps=512",
    "runner.max_wall_seconds=0",
    "runner.checkpoint_every=2",
    "eval.episodes_per_task=1",
    "eval.every_seconds=0",
]


@pytest.mark.parametrize("policy", ["hf_oft", "hf_pi0"])
def test_sft_then_rl_through_the_fleet(tmp_path, policy):
    run = tmp_path / "run"
    overrides = [
        *RUN,
        f"policy.name={policy}",
        f"demos.cache_dir={tmp_path / 'cache'}",
        f"runner.logger.log_path={run}",
    ]
    if policy == "hf_pi0":
        overrides += ["policy.expert_width=32", "policy.num_denoise_steps=3"]
    env = dict(os.environ, OMP_NUM_THREADS="1", RLFLEET_BACKBONES=str(tmp_path / "backbones"))
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "train", "metaworld_quickstart_hf_oft_cpu", *overrides],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 4 and summary["rejected_segments"] == 0
    assert set(summary["eval_success"]) == set(summary["eval_before"]) == {"reach-v3", "button-press-topdown-v3"}
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    config = json.loads((ckpt / "config.json").read_text())
    assert config["policy"]["name"] == policy and config["policy"]["backbone"] == "builtin:tiny-paligemma"
    with safe_open(ckpt / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
    assert any("lora_" in k for k in keys)
    assert not [k for k in keys if k.startswith("prefix.vlm.") and "lora_" not in k]  # no base weights
