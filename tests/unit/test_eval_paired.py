"""Evaluations compared episode by episode: `rlfleet eval` writes every episode (task, reset seed,
success, return, length) to episodes.jsonl, and `--compare OTHER` pairs them with another
evaluation's; the exact McNemar p is checked against scipy's binomial test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlfleet.eval.paired import (
    exact_mcnemar_p,
    paired_comparison,
    pairing_note,
    read_episodes,
    write_episodes,
)
from rlfleet.learner.checkpointer import Checkpointer, TrainerCounters
from rlfleet.policies.checkpoint_io import model_config, policy_from_config

ENV = {"name": "metaworld", "task": "reach-v3", "max_episode_steps": 20, "chunk_size": 1, "image_size": 0}


def _record(task: str, seed: int, success: bool) -> dict:
    return {"task": task, "seed": seed, "success": success, "return": float(success), "length": 10}


@pytest.mark.parametrize("only_this,only_other", [(0, 0), (0, 1), (3, 0), (4, 4), (1, 9), (12, 5), (0, 20), (37, 61)])
def test_exact_mcnemar_p_is_scipys_two_sided_binomial_test(only_this, only_other):
    stats = pytest.importorskip("scipy.stats")
    n = only_this + only_other
    expected = 1.0 if n == 0 else stats.binomtest(only_this, n, 0.5).pvalue
    assert exact_mcnemar_p(only_this, only_other) == pytest.approx(expected, rel=1e-12)


def test_paired_comparison_counts_the_discordant_episodes_per_task():
    this = [_record("a", s, ok) for s, ok in zip(range(10), [1, 1, 1, 1, 0, 0, 1, 1, 1, 1])]
    other = [_record("a", s, ok) for s, ok in zip(range(10), [1, 1, 0, 0, 0, 1, 0, 1, 1, 1])]
    this += [_record("b", 100, True), _record("c", 7, True)]
    other += [_record("b", 100, True), _record("b", 101, False), _record("c", 8, False)]  # c: no shared seed
    cmp = paired_comparison(this, other)
    assert [r["task"] for r in cmp["tasks"]] == ["a", "b"] and cmp["pairs"] == 11
    a = cmp["tasks"][0]
    assert (a["pairs"], a["only_this"], a["only_other"]) == (10, 3, 1)
    assert a["this"] == pytest.approx(0.8) and a["other"] == pytest.approx(0.6)
    assert a["difference"] == pytest.approx(0.2)
    assert a["p"] == pytest.approx(0.625)  # 2 * P(X <= 1), X ~ Bin(4, 1/2) = 2 * 5/16
    b = cmp["tasks"][1]
    assert (b["pairs"], b["only_this"], b["only_other"], b["p"]) == (1, 0, 0, 1.0)


def test_paired_comparison_without_a_shared_episode_says_how_to_get_one():
    with pytest.raises(ValueError, match="this one ran a from seed 1, the other b from seed 2; .*same --seed"):
        paired_comparison([_record("a", 1, True)], [_record("b", 2, True)])


def test_episodes_pair_on_the_scene_played_and_a_repeated_scene_counts_once():
    """An env that maps seeds onto a finite list (RoboTwin, CALVIN) names the scene: another seed
    or layout that replays it pairs with it, and a scene played twice is one piece of evidence."""
    this = [{**_record("a", 10_000 + j, j < 3), "scene": j % 4} for j in range(8)]  # scenes 0-3, twice
    other = [{**_record("a", 20_000 + j, False), "scene": j} for j in range(6)]  # scenes 0-5
    cmp = paired_comparison(this, other)
    (row,) = cmp["tasks"]
    assert (row["pairs"], row["only_this"], row["only_other"]) == (4, 3, 0)  # first episodes of scenes 0-3
    assert (cmp["unpaired_this"], cmp["unpaired_other"], cmp["repeats_this"], cmp["repeats_other"]) == (0, 2, 4, 0)
    note = pairing_note(cmp)
    assert note.startswith("paired 4 episodes; 0 episodes of this evaluation and 2 of the other")
    assert "4 here, 0 in the other" in note
    assert pairing_note(paired_comparison(other, other)) is None


def test_episode_records_round_trip_and_bad_files_are_one_line(tmp_path):
    records = [_record("a", 5, True), _record("b", 6, False)]
    path = write_episodes(records, tmp_path / "ev")
    assert read_episodes(tmp_path / "ev") == records == read_episodes(path)
    with pytest.raises(ValueError, match="missing: no such file .*eval.before=true"):
        read_episodes(tmp_path / "missing")
    (tmp_path / "bad.jsonl").write_text('{"task": "a", "seed": 1, "success": true}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        read_episodes(tmp_path / "bad.jsonl")
    (tmp_path / "short.jsonl").write_text('{"task": "a", "seed": 1}\n')
    with pytest.raises(ValueError, match=r"short.jsonl:1: an episode record needs task, seed, success"):
        read_episodes(tmp_path / "short.jsonl")


def _checkpoint(root: Path, torch_seed: int, evaluation: dict | None = None) -> Path:
    torch.manual_seed(torch_seed)
    policy_cfg = {"name": "gaussian_mlp", "hidden_sizes": [8]}
    policy = policy_from_config(policy_cfg, 39, 4, 1)
    return Checkpointer(root).save(
        policy,
        torch.optim.Adam(policy.parameters()),
        TrainerCounters(update=1, env_steps=64),
        model_config(policy_cfg, 39, 4, 1, ENV, evaluation=evaluation),
    )


def _eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "eval", *args], capture_output=True, text=True, timeout=300
    )


def test_rlfleet_eval_writes_each_episode_and_compares_two_policies_on_the_same_ones(tmp_path):
    first, second = _checkpoint(tmp_path / "run_a", 0), _checkpoint(tmp_path / "run_b", 1)
    res = _eval(str(first), "--episodes", "3", "--out", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr[-3000:]
    records = read_episodes(tmp_path / "a")
    assert [(r["task"], r["seed"]) for r in records] == [("reach-v3", s) for s in (10000, 10001, 10002)]
    assert all(1 <= r["length"] <= ENV["max_episode_steps"] for r in records)
    report = json.loads((tmp_path / "a" / "eval.json").read_text())
    assert report["tasks"][0]["success"] == pytest.approx(sum(r["success"] for r in records) / 3)
    assert report["mean_return"]["reach-v3"] == pytest.approx(sum(r["return"] for r in records) / 3)

    # The seed in a record is the episode's reset seed: evaluated alone from that seed, the same
    # deterministic policy plays the same episode.
    res = _eval(str(first), "--episodes", "1", "--seed", "10002", "--out", str(tmp_path / "one"))
    assert res.returncode == 0, res.stderr[-3000:]
    (alone,) = read_episodes(tmp_path / "one")
    assert alone == records[2]

    res = _eval(str(second), "--episodes", "3", "--out", str(tmp_path / "b"), "--compare", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr[-3000:]
    paired = json.loads((tmp_path / "b" / "eval.json").read_text())["paired"]
    theirs = read_episodes(tmp_path / "b")
    (row,) = paired["tasks"]
    assert paired["against"] == str(tmp_path / "a") and row["pairs"] == 3
    assert row["only_this"] == sum(b["success"] and not a["success"] for a, b in zip(records, theirs))
    assert row["only_other"] == sum(a["success"] and not b["success"] for a, b in zip(records, theirs))
    assert (tmp_path / "b" / "paired.md").read_text().count("| reach-v3 | 3 |") == 1

    res = _eval(str(first), "--episodes", "3", "--out", str(tmp_path / "same"), "--compare", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = json.loads((tmp_path / "same" / "eval.json").read_text())["paired"]["tasks"]
    assert (row["difference"], row["only_this"], row["only_other"], row["p"]) == (0.0, 0, 0, 1.0)
    assert json.loads((tmp_path / "same" / "eval.json").read_text())["mode"] == "deterministic"
    assert "note:" not in res.stdout

    res = _eval(
        str(first), "--episodes", "3", "--sample", "--out", str(tmp_path / "s"), "--compare", str(tmp_path / "a")
    )
    assert res.returncode == 0, res.stderr[-3000:]
    note = f"note: {tmp_path / 'a'} was evaluated deterministic, this evaluation sampled"
    assert note in res.stdout


def test_rlfleet_eval_compare_refuses_in_one_line(tmp_path):
    ckpt = _checkpoint(tmp_path / "run", 0)
    res = _eval(str(ckpt), "--episodes", "1", "--compare", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "no such file" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "x").exists()  # refused before any episode ran
    write_episodes([_record("reach-v3", 5, True)], tmp_path / "other")
    res = _eval(str(ckpt), "--episodes", "1", "--compare", str(tmp_path / "other"), "--out", str(tmp_path / "other"))
    assert res.returncode == 2 and "this evaluation's own report folder" in res.stderr  # it would overwrite it
    res = _eval(str(ckpt), "--episodes", "1", "--compare", str(tmp_path / "other"), "--out", str(tmp_path / "y"))
    assert res.returncode == 2 and "share no episode" in res.stderr and "Traceback" not in res.stderr
    assert (tmp_path / "y" / "eval.json").exists() and len(read_episodes(tmp_path / "y")) == 1  # nothing lost
    # a run folder's episodes.jsonl is the run's final evaluation: never an --out
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    write_episodes([_record("reach-v3", 10_000, True)], tmp_path / "run")
    res = _eval(str(ckpt), "--episodes", "1", "--seed", "5", "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and "is a run folder" in res.stderr and "Traceback" not in res.stderr
    assert read_episodes(tmp_path / "run") == [_record("reach-v3", 10_000, True)]
    res = _eval(str(ckpt), "--episodes", "0", "--out", str(tmp_path / "z"))
    assert (
        res.returncode == 2 and "--episodes must be at least 1, got 0" in res.stderr and not (tmp_path / "z").exists()
    )


def test_rlfleet_eval_of_a_runs_checkpoint_plays_the_runs_evaluation(tmp_path):
    """A checkpoint in a run folder is evaluated on the run's `eval_env.task` from its `eval.seed` for
    its `eval.episodes_per_task` (config.yaml), given as a checkpoint or as the run folder;
    `--task` / `--seed` still override, and a config.yaml that no longer loads costs a note, not
    the evaluation."""
    from rlfleet.config import load_config, to_yaml

    run = tmp_path / "run"
    ckpt = _checkpoint(run, 0)  # trained on reach-v3
    cfg = load_config(
        "metaworld_reach_ppo",
        ["env.task=reach-v3", "eval_env.task=push-v3", "eval.seed=12345", "eval.episodes_per_task=2"],
    )
    (run / "config.yaml").write_text(to_yaml(cfg))
    for target in (ckpt, run):
        res = _eval(str(target), "--out", str(tmp_path / "a"))
        assert res.returncode == 0, res.stderr[-3000:]
        assert "evaluating on the run's evaluation env: metaworld push-v3" in res.stdout
        assert [(r["task"], r["seed"]) for r in read_episodes(tmp_path / "a")] == [
            ("push-v3", 12345),
            ("push-v3", 12346),
        ]
    report = json.loads((tmp_path / "a" / "eval.json").read_text())
    assert (report["env"], report["seed"]) == ({"name": "metaworld", "task": "push-v3"}, 12345)
    res = _eval(str(ckpt), "--episodes", "1", "--task", "reach-v3", "--seed", "7", "--out", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(r["task"], r["seed"]) for r in read_episodes(tmp_path / "b")] == [("reach-v3", 7)]
    (run / "config.yaml").write_text(to_yaml(cfg) + "runner:\n  a_dropped_option: 1\n")
    res = _eval(str(ckpt), "--episodes", "1", "--out", str(tmp_path / "c"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "note: the run's config.yaml does not load" in res.stdout
    assert [(r["task"], r["seed"]) for r in read_episodes(tmp_path / "c")] == [("reach-v3", 10_000)]


def test_rlfleet_eval_of_a_validation_runs_checkpoint_writes_the_validation_report(tmp_path):
    """A run with eval.split=validation, evaluated without --split, plays the validation seeds and
    writes CHECKPOINT/eval_validation: never the test report's CHECKPOINT/eval."""
    from rlfleet.cli import main
    from rlfleet.config import load_config, to_yaml

    run = tmp_path / "run"
    ckpt = _checkpoint(run, 0)
    cfg = load_config("metaworld_reach_ppo", ["env.task=reach-v3", "eval.split=validation", "eval.episodes_per_task=1"])
    (run / "config.yaml").write_text(to_yaml(cfg))
    assert main(["eval", str(ckpt)]) == 0
    assert not (ckpt / "eval").exists()
    report = json.loads((ckpt / "eval_validation" / "eval.json").read_text())
    assert report["split"] == "validation" and report["seed"] == cfg.eval.validation_seed


def test_rlfleet_eval_of_a_checkpoint_outside_its_run_plays_the_evaluation_its_config_records(tmp_path):
    """A checkpoint away from its run folder (an SFT cache, an export, a Hub copy) records in
    config.json how its recipe evaluates it (`evaluation_record`): `rlfleet eval` plays that task
    from that seed for that many episodes per task, and the flags still override. A checkpoint
    written before the record plays its own env from the defaults."""
    import shutil

    from rlfleet.config import load_config
    from rlfleet.eval.splits import evaluation_record

    cfg = load_config("metaworld_reach_ppo", ["eval_env.task=push-v3", "eval.seed=12345", "eval.episodes_per_task=2"])
    record = evaluation_record(cfg)
    assert record == {"task": "push-v3", "seed": 12345, "validation_seed": 500_000, "episodes_per_task": 2}
    copy = tmp_path / "exported"
    shutil.copytree(_checkpoint(tmp_path / "run", 0, evaluation=record), copy)
    res = _eval(str(copy), "--out", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "evaluating on the checkpoint's evaluation env: metaworld push-v3" in res.stdout
    assert [(r["task"], r["seed"]) for r in read_episodes(tmp_path / "a")] == [("push-v3", 12345), ("push-v3", 12346)]
    res = _eval(str(copy), "--task", "reach-v3", "--seed", "7", "--episodes", "1", "--out", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(r["task"], r["seed"]) for r in read_episodes(tmp_path / "b")] == [("reach-v3", 7)]
    older = tmp_path / "older"
    shutil.copytree(_checkpoint(tmp_path / "old_run", 0), older)
    res = _eval(str(older), "--episodes", "1", "--out", str(tmp_path / "c"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(r["task"], r["seed"]) for r in read_episodes(tmp_path / "c")] == [("reach-v3", 10_000)]
