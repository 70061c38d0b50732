"""`rlfleet average`: the mean of a run's last checkpoints' weights as a checkpoint that rebuilds,
evaluates as the run's own, and refuses checkpoints of different policies in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlfleet.config import load_config, to_yaml
from rlfleet.eval.paired import read_episodes
from rlfleet.learner.checkpointer import Checkpointer, TrainerCounters
from rlfleet.policies.averaging import average_checkpoints, run_checkpoints
from rlfleet.policies.checkpoint_io import load_checkpoint, model_config, policy_from_config

ENV = {"name": "metaworld", "task": "reach-v3", "max_episode_steps": 20, "chunk_size": 1, "image_size": 0}
POLICY = {"name": "gaussian_mlp", "hidden_sizes": [8]}


def _run_with_checkpoints(run: Path, updates: list[int], policy_cfg: dict = POLICY) -> list[Path]:
    checkpointer = Checkpointer(run, keep=len(updates))
    folders = []
    for update in updates:
        torch.manual_seed(update)  # each checkpoint its own weights
        policy = policy_from_config(policy_cfg, 39, 4, 1)
        counters = TrainerCounters(update=update, env_steps=64 * update)
        optimizer = torch.optim.Adam(policy.parameters())
        folders.append(checkpointer.save(policy, optimizer, counters, model_config(policy_cfg, 39, 4, 1, ENV)))
    return folders


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlfleet.cli", *args], capture_output=True, text=True, timeout=300)


def test_rlfleet_average_of_a_run_writes_the_mean_of_its_last_checkpoints(tmp_path):
    run = tmp_path / "run"
    folders = _run_with_checkpoints(run, [10, 20, 30])
    cfg = load_config("metaworld_reach_ppo", ["env.task=reach-v3", "eval_env.task=push-v3", "eval.episodes_per_task=1"])
    (run / "config.yaml").write_text(to_yaml(cfg))
    res = _cli("average", str(run), "--last", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    out = run / "checkpoints" / "average"
    averaged = load_file(out / "model.safetensors")
    second, third = (load_file(f / "model.safetensors") for f in folders[1:])
    assert averaged.keys() == third.keys()
    for name, tensor in averaged.items():
        if tensor.is_floating_point():
            expected = (second[name].double() + third[name].double()) / 2
            torch.testing.assert_close(tensor, expected.to(tensor.dtype))
        else:
            assert torch.equal(tensor, third[name])
    assert any(not torch.equal(averaged[k], third[k]) for k in averaged)  # the checkpoints did differ
    config = json.loads((out / "config.json").read_text())
    assert config["averaged_from"] == ["update_000020", "update_000030"]
    policy, _ = load_checkpoint(out)  # rebuilds as any checkpoint
    assert torch.equal(policy.state_dict()[next(iter(averaged))], averaged[next(iter(averaged))])
    assert (run / "checkpoints" / "latest").read_text() == "update_000030"  # resume and `eval RUN` unchanged

    # beside the run's config.yaml, it is evaluated as the run's own checkpoints are
    res = _cli("eval", str(out), "--out", str(tmp_path / "ev"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(r["task"], r["seed"]) for r in read_episodes(tmp_path / "ev")] == [("push-v3", 10_000)]

    res = _cli("average", str(run))  # all kept checkpoints, replacing the earlier average
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["averaged_from"] == [f.name for f in folders]


def test_average_never_replaces_a_run_or_a_checkpoint_and_skips_checkpointer_leftovers(tmp_path):
    run = tmp_path / "run"
    folders = _run_with_checkpoints(run, [1, 2, 3])
    (run / "config.yaml").write_text("runner: {}\n")
    (run / "summary.json").write_text("{}")
    a, b = (str(f) for f in folders[:2])
    for out in (run, run / "checkpoints", folders[0]):
        res = _cli("average", a, b, "--out", str(out))
        assert res.returncode == 2 and "holds the checkpoint" in res.stderr, res.stderr
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    res = _cli("average", a, b, "--out", str(tmp_path / "notes"))  # exists, holds other things
    assert res.returncode == 2 and "is not an earlier average" in res.stderr
    assert [f.name for f in run_checkpoints(run)] == ["update_000001", "update_000002", "update_000003"]
    assert (run / "config.yaml").exists() and (run / "summary.json").exists()
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    # a crash's leftovers (the Checkpointer's .old / .tmp folders) are no checkpoints to average
    shutil.copytree(folders[2], run / "checkpoints" / "update_000003.old")
    (run / "checkpoints" / "update_000004.tmp").mkdir()
    res = _cli("average", str(run), "--last", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    config = json.loads((run / "checkpoints" / "average" / "config.json").read_text())
    assert config["averaged_from"] == ["update_000002", "update_000003"]
    res = _cli("average", str(run), "--last", "2", "--out", str(run / "checkpoints" / "average"))
    assert res.returncode == 0, res.stderr[-3000:]  # an earlier average is replaced
    for last, says in (("4", "keeps 3 checkpoints; --last 4 asks for more"), ("-1", "--last -1")):
        res = _cli("average", str(run), "--last", last)
        assert res.returncode == 2 and says in res.stderr, res.stderr
    res = _cli("average", a, b, "--out", str(tmp_path / "update_000009"))
    assert res.returncode == 2 and "named like a training checkpoint" in res.stderr
    res = _cli("average", str(folders[0]))
    assert res.returncode == 2 and "is not a run folder" in res.stderr
    res = _cli("average", str(tmp_path / "no-run"))
    assert res.returncode == 2 and f"{tmp_path / 'no-run'} does not exist" in res.stderr


def test_integer_tensors_come_from_the_newest_and_layouts_must_agree(tmp_path):
    def folder(name: str, tensors: dict) -> Path:
        (tmp_path / name).mkdir()
        save_file(tensors, tmp_path / name / "model.safetensors")
        (tmp_path / name / "config.json").write_text(json.dumps({"policy": {"name": "toy"}}))
        return tmp_path / name

    old = folder("old", {"w": torch.tensor([1.0, 3.0]), "count": torch.tensor([5])})
    new = folder("new", {"w": torch.tensor([2.0, 5.0]), "count": torch.tensor([9])})
    out = load_file(average_checkpoints([old, new], tmp_path / "avg") / "model.safetensors")
    assert torch.equal(out["w"], torch.tensor([1.5, 4.0])) and torch.equal(out["count"], torch.tensor([9]))
    half = folder("half", {"w": torch.tensor([2.0, 5.0], dtype=torch.float16), "count": torch.tensor([9])})
    with pytest.raises(ValueError, match="differ in tensors \\['w'\\]"):
        average_checkpoints([old, half], tmp_path / "avg2")


def test_an_exported_average_says_so_and_does_not_borrow_the_runs_results(tmp_path):
    from rlfleet.eval.report import checkpoint_eval_markdown
    from rlfleet.policies.hub import export_checkpoint

    run = tmp_path / "run"
    folders = _run_with_checkpoints(run, [1, 2])
    summary = {"eval_success": {"reach-v3": 0.9}, "eval_before": {"reach-v3": 0.2}, "eval_success_mean": 0.9}
    (run / "config.yaml").write_text("runner: {}\n")
    (run / "summary.json").write_text(json.dumps(summary))
    average = average_checkpoints(folders, run / "checkpoints" / "average")
    card = (
        export_checkpoint(average, tmp_path / "exp", eval_markdown=checkpoint_eval_markdown) / "README.md"
    ).read_text()
    assert "the mean of the checkpoints `update_000001`, `update_000002`" in card
    assert "Success before / after" not in card and "eval_success_mean" not in card
    card = (
        export_checkpoint(folders[0], tmp_path / "first", eval_markdown=checkpoint_eval_markdown) / "README.md"
    ).read_text()
    assert "Success before / after" not in card  # an earlier checkpoint: the summary is the last one's
    card = (export_checkpoint(run, tmp_path / "last", eval_markdown=checkpoint_eval_markdown) / "README.md").read_text()
    assert "Success before / after" in card and "eval_success_mean" in card


def test_average_checkpoints_refuses_what_is_not_one_runs_policy(tmp_path):
    a = _run_with_checkpoints(tmp_path / "a", [1])[0]
    b = _run_with_checkpoints(tmp_path / "b", [2], {"name": "gaussian_mlp", "hidden_sizes": [16]})[0]
    res = _cli("average", str(a), str(b), "--out", str(tmp_path / "avg"))
    assert res.returncode == 2
    assert "holds another policy" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "avg").exists()
    res = _cli("average", str(a), str(tmp_path / "nowhere"), "--out", str(tmp_path / "avg"))
    assert res.returncode == 2 and f"{tmp_path / 'nowhere'} does not exist" in res.stderr
    res = _cli("average", str(tmp_path / "a"), "--last", "1")
    assert res.returncode == 2 and "two checkpoints or more" in res.stderr
    res = _cli("average", str(a), str(a), "--out", str(a))
    assert res.returncode == 2 and "holds the checkpoint" in res.stderr
    with pytest.raises(ValueError, match="two checkpoints or more"):
        average_checkpoints([a], tmp_path / "x")
