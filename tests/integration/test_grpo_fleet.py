"""GRPO end to end through real processes: `rlfleet train` in local mode (learner, inference
server, actor with env worker subprocesses) with whole-episode grouped segments."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from role_processes import TINY
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

GRPO = [
    "algorithm.adv_type=grpo",
    "algorithm.group_size=2",
    "algorithm.group_filter=[-1000000.0,1000000.0]",
    "algorithm.update_epochs=2",
    "algorithm.num_minibatches=2",
    "eval.at_end=false",
]


def test_grpo_train_local(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # TINY: 4 envs in 2 stages, 20-step episodes, chunks of 1: segments of 20 steps x 2 envs (one group)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlfleet.cli",
            "train",
            "metaworld_reach_ppo",
            *TINY,
            *GRPO,
            "runner.total_env_steps=560",
            f"runner.logger.log_path={run}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 3
    assert summary["rejected_segments"] == 0  # every segment held whole episodes of whole groups

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    last = {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]}
    assert last["train/grpo/groups"] >= 2 and 0 <= last["train/grpo/filtered_groups"] <= last["train/grpo/groups"]
    assert last["train/grpo/filtered_groups"] == 0  # the bounds keep every group
    # each group's advantages sum to zero, so their mean over all trajectories is 0
    assert abs(last["train/grpo/advantage_mean"]) < 1e-4
    assert 0 < last["train/grpo/advantage_abs_max"] <= 1.0 + 1e-4  # groups of 2: A = +-1 (or 0)
    assert last["train/grpo/valid_step_fraction"] == 1.0  # MetaWorld never terminates early
    assert last["env/episode_len"] == 20.0  # whole episodes, each reported once
    assert not any(t.startswith("train/critic/") for t in last)  # no critic in GRPO
    assert "throughput/policy_lag_count/0" in last
    assert "throughput/policy_lag_hist" in acc.Tags()["histograms"]
