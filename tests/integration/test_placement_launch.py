"""`rlfleet train` with cluster.component_placement: the plan decides how many of each role start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from role_processes import TINY


def test_collocated_placement_on_cpu_slots(tmp_path):
    """2 actors, 2 inference servers and a 2-rank (gloo) torchrun learner, from one placement line."""
    run = tmp_path / "run"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlfleet.cli",
            "train",
            "metaworld_reach_ppo",
            *TINY,
            "runner.total_env_steps=640",
            f"runner.logger.log_path={run}",
            "cluster.cpu_slots=2",
            "cluster.component_placement={'env,rollout,actor': all}",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=420,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "placement: collocated" in res.stderr and "no CUDA device here" in res.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] >= 640
    assert set(summary["segments_by_client"]) == {"actor0", "actor1"}, summary["segments_by_client"]
    logs = run / "logs"
    assert (logs / "inference.log").exists() and (logs / "inference1.log").exists()
    for name in ("inference", "inference1"):  # both servers followed the learner's weights
        assert json.loads((run / "addresses" / f"{name}.json").read_text())["inference"].startswith("127.0.0.1:")
    assert "rank 1 of 2" in res.stderr  # the learner ran as 2 DDP ranks under torchrun
