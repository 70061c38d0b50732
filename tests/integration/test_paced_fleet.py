"""A real local fleet whose learner is far slower than its actors (the zero-cost env, 40 epochs
per update): paced (learner.flow_control=pace, the default) no row is older than
algorithm.max_policy_lag when trained, and every env step the actors took is trained, masked or
lost, each counted."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

MAX_LAG = 2


@pytest.mark.slow  # a local fleet for a few hundred updates: about a minute here
def test_a_paced_fleet_trains_every_row_within_the_lag_bound_under_a_slow_learner(tmp_path):
    run = tmp_path / "run"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlfleet.cli",
            "train",
            "metaworld_reach_ppo",
            "env.name=bench",
            "env.task=state_dim=8,action_dim=4,busy_us=0",
            "env.max_episode_steps=20",
            "actor.num_envs=8",
            "actor.num_workers=1",
            "actor.pipeline_stage_num=2",
            "actor.rollout_len=8",  # a stage's segment: 8 steps x 4 envs = 32 samples
            "learner.batch_samples=80",  # not a multiple of a segment: updates split segments
            f"algorithm.max_policy_lag={MAX_LAG}",
            "algorithm.update_epochs=40",  # the slow learner: 160 optimiser steps per update
            "policy.hidden_sizes=[32,32]",
            "runner.total_env_steps=4000",
            "runner.max_wall_seconds=0",
            "runner.checkpoint_every=1000",
            "eval.at_end=false",
            "eval.before=false",
            f"runner.logger.log_path={run}",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["flow_control"] == "pace"
    assert summary["paced_credit_waits"] > 0  # the actors did wait for the learner: pacing was exercised
    # the lag distribution of every received row: nothing beyond the bound, so nothing masked
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    lags = {int(tag.rsplit("/", 1)[1]) for tag in events.Tags()["scalars"] if "policy_lag_count/" in tag}
    too_old = [
        (lag, sum(e.value for e in events.Scalars(f"throughput/policy_lag_count/{lag}")))
        for lag in lags
        if lag > MAX_LAG
    ]
    assert all(n == 0 for _, n in too_old), too_old
    assert summary["masked_env_steps"] == 0 and summary["trained_env_steps"] > 0
    # every counted env step: trained, masked, or in no update (carried columns, a partial batch)
    counted = summary["trained_env_steps"] + summary["masked_env_steps"] + summary["untrained_env_steps"]
    assert counted == summary["env_steps"] and summary["untrained_env_steps"] >= 0
    assert summary["trained_share"] == round(summary["trained_env_steps"] / summary["env_steps"], 4)
    # and every env step the actors took: counted, or lost by a cause (rlfleet.learner.losses)
    taken = [struct.unpack("<qqq", p.read_bytes()[:24])[0] for p in (run / "ledgers").iterdir()]
    assert sum(taken) == summary["env_steps"] + sum(summary["lost_env_steps"].values()), (taken, summary)
    assert f"trained on {summary['trained_env_steps']} of {summary['env_steps']} env steps" in res.stderr
