"""Hugging Face Hub checkpoints without a network: `rlfleet export` writes a Hub-ready folder, a
Hugging Face cache laid out in a temp dir serves it as hf://ORG/NAME[@REV] under HF_HUB_OFFLINE=1,
and the policy loaded from there acts exactly as the original."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlfleet.config import load_config, to_yaml
from rlfleet.learner.checkpointer import Checkpointer, TrainerCounters
from rlfleet.policies.checkpoint_io import model_config, parse_hub_path, policy_from_config

pytest.importorskip("huggingface_hub")

COMMIT_MAIN, COMMIT_V1 = "a" * 40, "b" * 40
ENV = {"name": "metaworld", "task": "reach-v3", "max_episode_steps": 150, "chunk_size": 1, "image_size": 0}


def make_run(tmp_path: Path) -> Path:
    """A run folder as a training run leaves it: a checkpoint, config.yaml and summary.json."""
    run = tmp_path / "run"
    torch.manual_seed(0)
    policy_cfg = {"name": "gaussian_mlp", "hidden_sizes": [16, 16]}
    policy = policy_from_config(policy_cfg, 39, 4, 1)
    policy.update_normalization({"states": torch.randn(64, 39) * 3 + 1})
    opt = torch.optim.Adam(policy.parameters())
    info = {
        "command": "rlfleet train metaworld_reach_ppo runner.seed=3",
        "commit": "0123abc",
        "rlfleet_version": "0.1.0",
    }
    folder = Checkpointer(run, info=info).save(
        policy, opt, TrainerCounters(update=5, env_steps=20480), model_config(policy_cfg, 39, 4, 1, ENV)
    )
    # the whole resolved config, as `rlfleet train` writes it (evaluation reads the run's env and splits)
    (run / "config.yaml").write_text(to_yaml(load_config("metaworld_reach_ppo", ["runner.experiment_name=reach"])))
    (run / "summary.json").write_text(
        json.dumps(
            {
                "env_steps": 20480,
                "updates": 5,
                "train_seconds": 61.5,
                "eval_success_mean": 0.9,
                "eval_success": {"reach-v3": 0.9},
                "eval_before": {"reach-v3": 0.2},
                "eval_before_mean": 0.2,
            }
        )
    )
    return folder


def cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def lay_hf_cache(cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...]) -> Path:
    """The huggingface_hub cache layout: models--ORG--NAME/{blobs, snapshots/COMMIT, refs/REF}, with
    snapshot files linking to content-addressed blobs, as snapshot_download leaves it."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for i, src in enumerate(sorted(folder.iterdir())):
        blob = root / "blobs" / f"{commit[:8]}{i:032x}"
        shutil.copyfile(src, blob)
        (snap / src.name).symlink_to(os.path.relpath(blob, snap))
    (root / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    return snap


def exported_run(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    """A trained checkpoint, its `rlfleet export` folder, an empty Hugging Face cache dir and the
    offline environment that points huggingface_hub at it."""
    ckpt = make_run(tmp_path)
    out = tmp_path / "export"
    assert cli("export", str(ckpt), str(out)).returncode == 0
    cache = tmp_path / "hf" / "hub"
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return ckpt, out, cache, env


def run_script(script: str, *args: str, env: dict[str, str]) -> dict:
    """Run `script` in a fresh interpreter (huggingface_hub reads its env vars at import) and return
    the JSON its last line prints."""
    res = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_parse_hub_path():
    assert parse_hub_path("hf://acme/reach") == ("acme/reach", None)
    assert parse_hub_path("hf://acme/reach@v1.2") == ("acme/reach", "v1.2")
    with pytest.raises(ValueError, match="hf://ORG/NAME"):
        parse_hub_path("hf://reach")


def test_export_writes_a_hub_ready_folder(tmp_path):
    ckpt = make_run(tmp_path)
    out = tmp_path / "export"
    res = cli("export", str(ckpt.parent.parent), str(out), "--repo-id", "acme/reach-mlp")  # the run folder
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "norm_stats.json",
        "training.json",
    ]
    assert (out / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
    norm = json.loads((out / "norm_stats.json").read_text())
    assert len(norm["observation"]["obs_norm"]["mean"]) == 39 and len(norm["observation"]["obs_norm"]["std"]) == 39
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: rlfleet\n")
    assert "rlfleet train metaworld_reach_ppo runner.seed=3" in card  # training command
    assert "0123abc" in card and "| env_steps | 20480 |" in card  # commit, metrics
    assert "| reach-v3 | Easy | 20.0 | 90.0 | +70.0 |" in card  # before / after table
    assert "rlfleet eval hf://acme/reach-mlp" in card
    assert not list(out.glob("trainer_state*"))  # optimiser state stays private


def test_export_of_a_non_checkpoint_is_one_line(tmp_path):
    res = cli("export", str(tmp_path), str(tmp_path / "out"))
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "not a checkpoint folder" in res.stderr


_ACT_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from rlfleet.policies.checkpoint_io import load_checkpoint, policy_from_config, resolve_model_path
    local, *hub = sys.argv[1:]
    torch.manual_seed(7)
    obs = {"states": torch.randn(5, 39)}
    def act(path):
        policy, _ = load_checkpoint(path)
        return policy.act(obs, deterministic=True)["actions"]
    ref = act(local)
    out = {p: {"same": bool(torch.equal(act(p), ref)), "path": str(resolve_model_path(p))} for p in hub}
    # the learner's path: policy.model_path=hf://... checked against the run's dimensions
    p = policy_from_config({"name": "gaussian_mlp", "model_path": hub[0]}, 39, 4, 1)
    out["policy_from_config"] = bool(torch.equal(p.act(obs, deterministic=True)["actions"], ref))
    print(json.dumps(out))
""")


def test_hf_path_round_trip_from_an_offline_cache(tmp_path):
    ckpt, out, cache, env = exported_run(tmp_path)
    snap = lay_hf_cache(cache, "acme/reach-mlp", out, COMMIT_MAIN, ("main",))
    (cache / "models--acme--reach-mlp" / "refs" / "v1").write_text(COMMIT_MAIN)
    env["HF_TOKEN"] = ""
    result = run_script(
        _ACT_SCRIPT,
        str(ckpt),
        "hf://acme/reach-mlp",
        "hf://acme/reach-mlp@v1",
        f"hf://acme/reach-mlp@{COMMIT_MAIN}",
        env=env,
    )
    for path in ("hf://acme/reach-mlp", "hf://acme/reach-mlp@v1", f"hf://acme/reach-mlp@{COMMIT_MAIN}"):
        assert result[path] == {"same": True, "path": str(snap)}, path
    assert result["policy_from_config"] is True

    # not cached + offline: one line, exit 2
    ev = cli("eval", "hf://acme/missing", "--episodes", "1", env=env)
    assert ev.returncode == 2
    assert len(ev.stderr.strip().splitlines()) == 1 and "hf://acme/missing" in ev.stderr, ev.stderr


@pytest.mark.slow  # two MetaWorld evaluations: ~30 s on 2 busy cores
def test_rlfleet_eval_of_hf_path_matches_the_local_folder(tmp_path):
    """`rlfleet eval hf://...` (offline cache) reports what `rlfleet eval FOLDER` does: same
    weights, same seeds, same episodes."""
    ckpt, out, cache, env = exported_run(tmp_path)
    lay_hf_cache(cache, "acme/reach-mlp", out, COMMIT_V1, ("v1",))
    reports = []
    for path in (str(ckpt), "hf://acme/reach-mlp@v1"):
        res = cli(
            "eval",
            path,
            "--episodes",
            "2",
            "--json",
            "--out",
            str(tmp_path / path.replace("/", "_")),
            env=env,
            timeout=240,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        reports.append(json.loads(res.stdout.strip().splitlines()[-1]))
    assert reports[0]["tasks"] == reports[1]["tasks"] and reports[0]["tasks"][0]["task"] == "reach-v3"


def test_push_without_network_is_one_line(tmp_path):
    """`rlfleet push` is not run against the Hub in tests; offline it fails cleanly after exporting."""
    ckpt = make_run(tmp_path)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_TOKEN": ""}
    res = cli("push", str(ckpt), "acme/reach-mlp", env=env)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "push to acme/reach-mlp failed" in lines[0], res.stderr


_PIN_SCRIPT = textwrap.dedent("""
    import json, os, pathlib, sys
    import huggingface_hub
    from rlfleet.config import config_from_yaml, load_config
    from rlfleet.learner.main import Learner
    from rlfleet.policies.checkpoint_io import pin_model_path
    from rlfleet.wire.run_spec import RunSpec, read_run_spec
    lookups = []  # every snapshot_download the run makes, by revision
    real = huggingface_hub.snapshot_download
    def counted(repo_id, revision=None, **kw):
        lookups.append(revision)
        return real(repo_id, revision=revision, **kw)
    huggingface_hub.snapshot_download = counted
    run_dir, local = sys.argv[1:3]
    out = {p: pin_model_path(p) for p in ("hf://acme/reach-mlp", "hf://acme/reach-mlp@v1", local)}
    lookups.clear()
    cfg = load_config("metaworld_reach_ppo", [f"runner.logger.log_path={run_dir}", "actor.num_envs=4",
        "policy.model_path=hf://acme/reach-mlp", "policy.hidden_sizes=[16,16]", "algorithm.kl_beta=0.1"])
    learner = Learner(cfg, pathlib.Path(run_dir))
    out["served"] = RunSpec.from_proto(learner.servicer.run_spec).model_path
    out["run_spec_json"] = read_run_spec(pathlib.Path(run_dir)).model_path
    out["config_yaml"] = config_from_yaml(open(f"{run_dir}/config.yaml").read()).policy.model_path
    out["lookups"] = list(lookups)
    learner.close()
    # the branch moves to another commit between two lives of the run
    refs = pathlib.Path(os.environ["HF_HUB_CACHE"]) / "models--acme--reach-mlp" / "refs" / "main"
    refs.write_text(sys.argv[3])
    for name, resume in (("resumed", "true"), ("new_run", "false")):
        folder = run_dir if resume == "true" else run_dir + "_new"
        cfg = load_config("metaworld_reach_ppo", [f"runner.logger.log_path={folder}", "actor.num_envs=4",
            "policy.model_path=hf://acme/reach-mlp", "policy.hidden_sizes=[16,16]", f"runner.resume={resume}"])
        learner = Learner(cfg, pathlib.Path(folder))
        out[name] = RunSpec.from_proto(learner.servicer.run_spec).model_path
        learner.close()
    print(json.dumps(out))
""")


def test_a_run_pins_its_hub_checkpoint_to_one_commit(tmp_path):
    """The learner reads its starting checkpoint several times (policy, KL reference, config.json)
    and serves the run spec other processes build from: all of it names the commit the branch
    pointed to once, so one lookup resolves the branch and nothing can mix two revisions; a
    resumed life keeps that commit (its run_spec.json) after the branch moved. config.yaml keeps
    the user's model_path as written."""
    ckpt, out, cache, env = exported_run(tmp_path)
    lay_hf_cache(cache, "acme/reach-mlp", out, COMMIT_MAIN, ("main", "v1"))
    lay_hf_cache(cache, "acme/reach-mlp", out, COMMIT_V1, ())  # the commit main moves to
    result = run_script(_PIN_SCRIPT, str(tmp_path / "rl"), str(ckpt), COMMIT_V1, env=env)
    pinned = f"hf://acme/reach-mlp@{COMMIT_MAIN}"
    assert result["hf://acme/reach-mlp"] == result["hf://acme/reach-mlp@v1"] == pinned
    assert result[str(ckpt)] == str(ckpt)  # a local folder stays as it is
    assert result["served"] == result["run_spec_json"] == pinned  # what --resume can name
    assert result["config_yaml"] == "hf://acme/reach-mlp"  # the user's config, not rewritten
    assert result["lookups"][0] is None and len(result["lookups"]) > 1  # the branch once, then the commit
    assert all(rev == COMMIT_MAIN for rev in result["lookups"][1:]), result["lookups"]
    # after the branch moved: a resumed life keeps its first life's commit, a new run takes the new one
    assert result["resumed"] == pinned
    assert result["new_run"] == f"hf://acme/reach-mlp@{COMMIT_V1}"


def test_the_cards_evaluation_table_counts_the_runs_final_episodes(tmp_path):
    """A run measured without a start (no eval_before): the card's table gives each task's episodes
    from the run's episodes.jsonl."""
    from rlfleet.eval.paired import write_episodes
    from rlfleet.eval.report import checkpoint_eval_markdown

    ckpt = make_run(tmp_path)
    summary = {"eval_success": {"reach-v3": 2 / 3}}
    records = [{"task": "reach-v3", "seed": s, "success": s > 0, "return": 1.0, "length": 9} for s in range(3)]
    write_episodes(records, ckpt.parent.parent)
    card = checkpoint_eval_markdown(summary, ckpt, "metaworld")
    assert card is not None and "| reach-v3 | Easy | 66.7 | 3 |" in card
    (ckpt.parent.parent / "episodes.jsonl").unlink()  # not kept: the count is unknown, not made up
    assert "| reach-v3 | Easy | 66.7 | - |" in checkpoint_eval_markdown(summary, ckpt, "metaworld")
