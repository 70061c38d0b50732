"""bench/reproduce.py end to end: two tiny training seeds, each with its own SFT start, a results page, both plots."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from role_processes import TINY

REPRODUCE = Path(__file__).resolve().parents[2] / "bench" / "reproduce.py"


def _reproduce(out: Path, seeds: int, *args: str) -> subprocess.CompletedProcess:
    """bench/reproduce.py on the reach recipe into `out`, one thread per process."""
    return subprocess.run(
        [sys.executable, str(REPRODUCE), "metaworld_reach_ppo", "--seeds", str(seeds), "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=900,
    )


@pytest.mark.slow
def test_two_seeds_give_a_results_page_with_plots(tmp_path):
    out = tmp_path / "repro"
    # each seed builds its own SFT start from the same (tiny) demos: a full repeat
    sft = [
        "demos.bootstrap=true",
        "demos.episodes_per_task=2",
        f"demos.cache_dir={tmp_path / 'cache'}",
        "sft.steps=5",
        "env.max_episode_steps=100",  # long enough for the scripted expert to succeed
    ]
    overrides = [*TINY, *sft, "runner.total_env_steps=640", "eval.every_updates=4"]
    res = _reproduce(out, 2, *overrides)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    page = (out / "results.md").read_text()
    assert "| reach-v3 |" in page and "| **mean** |" in page and "over 2 training seeds" in page
    starts = []
    for seed in (0, 1):
        assert (
            f"runner.seed={seed} env.seed={seed} sft.seed={seed} eval.before=true "
            f"runner.logger.log_path={out}/seed{seed}" in page
        )
        summary = json.loads((out / f"seed{seed}" / "summary.json").read_text())
        assert "eval_before" in summary and "eval_success" in summary
        starts.append(yaml.safe_load((out / f"seed{seed}" / "config.yaml").read_text())["policy"]["model_path"])
    assert len(set(starts)) == 2 and all(Path(s).parent == tmp_path / "cache" for s in starts)
    assert len(list((tmp_path / "cache").glob("demos-*"))) == 1  # the same demos for both
    assert "Each seed is a full repeat: its own SFT start on the same demos" in page
    assert "The binomial standard error of one evaluation" in page
    # the folder's data goes into a results page's data folder and shows there by difficulty group
    spec = importlib.util.spec_from_file_location("results_page", REPRODUCE.parent / "results_page.py")
    results_page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results_page)
    data = tmp_path / "data"
    shutil.copytree(REPRODUCE.parents[1] / "docs" / "results", data, ignore=shutil.ignore_patterns("*.png"))
    added = results_page.add_result(out, "metaworld_mt50", data, selected_on="test")
    assert not list(added.rglob("*.safetensors")) and (added / "curves.json").exists()
    section = results_page.build_page(data).split("## MetaWorld MT50")[1].split("\n## ")[0]
    assert "| SFT start (ours) |" in section and "each a full repeat" in section
    assert "`metaworld_reach_ppo`, 2 seeds" in section and "Policy `gaussian_mlp` on states" in section
    for png in ("metaworld_reach_ppo_steps.png", "metaworld_reach_ppo_seconds.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG" and f"({png})" in page
    agg = json.loads((out / "results.json").read_text())
    assert agg["seeds"] == 2 and len(agg["env_steps"]) == 2 and all(s >= 640 for s in agg["env_steps"])
    # --report-only rebuilds the same page from the runs on disk, without training
    again = _reproduce(out, 2, "--report-only", *overrides)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "results.md").read_text() == page
    # a larger budget continues seed 0 from its checkpoint, keeping its first evaluation of the start
    before = json.loads((out / "seed0" / "summary.json").read_text())["eval_before"]
    longer = [o if not o.startswith("runner.total_env_steps=") else "runner.total_env_steps=1280" for o in overrides]
    more = _reproduce(out, 1, *longer)
    assert more.returncode == 0, more.stderr[-3000:] + more.stdout[-2000:]
    assert "--resume" in more.stdout
    summary = json.loads((out / "seed0" / "summary.json").read_text())
    assert summary["env_steps"] >= 1280 and summary["eval_before"] == before
    assert summary["train_seconds_all_lives"] > summary["train_seconds"]  # the first life's time counts too
    spec = json.loads((out / "seed0" / "run_spec.json").read_text())
    assert 640 <= spec["resumed_from_env_steps"] < 1280  # its envs drew a new episode stream
    log = (out / "seed0.log").read_text()
    assert "--resume: the starting policy's evaluation from" in log and "resumed from" in log
    assert "Resumed (`--resume`, same folder): seed 0 from" in (out / "results.md").read_text()
