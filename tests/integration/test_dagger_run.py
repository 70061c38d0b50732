"""`rlfleet train <dagger recipe>` end to end, tiny: SFT bootstrap (demos + flow matching), 2 DAgger
iterations with the scripted experts, checkpoints, TensorBoard, summary.json and before_after.md."""

from __future__ import annotations

import json

import numpy as np

from rlfleet.algorithms.dagger import AggregatedDataset
from rlfleet.cli import main
from rlfleet.policies.checkpoint_io import load_checkpoint

TINY = [
    "env.task=reach-v3",
    "env.max_episode_steps=48",
    "env.chunk_size=8",
    "env.image_size=32",
    "policy.dim=32",
    "policy.depth=1",
    "policy.heads=2",
    "demos.episodes_per_task=1",
    "demos.num_workers=1",
    "sft.steps=3",
    "sft.batch_size=8",
    "dagger.iterations=2",
    "dagger.num_envs=2",
    "dagger.train_steps=3",
    "dagger.batch_size=8",
    "dagger.window=80",
    "eval.episodes_per_task=1",
    "runner.checkpoint_every=1",
    "runner.max_wall_seconds=0",
]


def _run(tmp_path, *overrides: str) -> dict:
    run_dir = tmp_path / "run"
    rc = main(
        [
            "train",
            "metaworld_dagger_tinypi0_cpu",
            *TINY,
            f"demos.cache_dir={tmp_path / 'cache'}",
            f"runner.logger.log_path={run_dir}",
            *overrides,
        ]
    )
    assert rc == 0
    return json.loads((run_dir / "summary.json").read_text())


def test_dagger_recipe_trains_from_the_sft_bootstrap(tmp_path):
    summary = _run(tmp_path, "dagger.eval_every=1", "dagger.eval_episodes_per_task=1")
    run_dir = tmp_path / "run"
    assert summary["algorithm"] == "dagger" and summary["variant"] == "dagger" and summary["iterations"] == 2
    assert summary["env_steps"] == 2 * 2 * 48  # 2 iterations x 2 envs x one 48-step episode
    # the bootstrap made an SFT checkpoint and the run started from it
    sft = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("sft-")]
    assert len(sft) == 1 and (sft[0] / "model.safetensors").exists()
    # before/after evaluation on the same eval episodes, and the report
    assert set(summary["eval_before"]) == set(summary["eval_success"]) == {"reach-v3"}
    report = (run_dir / "before_after.md").read_text()
    assert "before / after DAgger" in report and "reach-v3" in report
    from rlfleet.eval.paired import paired_comparison, read_episodes  # both evaluations, episode by episode

    (row,) = paired_comparison(read_episodes(run_dir), read_episodes(run_dir / "episodes_before.jsonl"))["tasks"]
    assert (row["this"], row["other"]) == (summary["eval_success"]["reach-v3"], summary["eval_before"]["reach-v3"])
    # the evaluation after iteration 1 keeps its episodes where an RL run keeps its periodic ones
    (mid,) = read_episodes(run_dir / "periodic_eval" / "update_000001")
    assert (mid["task"], mid["seed"]) == ("reach-v3", 10_000)
    assert mid["success"] == summary["history"][0]["eval/success_once"]  # the learner's periodic scalars
    # the history: beta decays 0.5 -> 0.25, D = demos (the window's newest 80 rows) + 2 x 12 chunk samples
    h = summary["history"]
    assert [r["dagger/beta"] for r in h] == [0.5, 0.25]
    assert h[-1]["dagger/dataset_size"] == summary["dataset_size"] <= 80
    assert all(r["dagger/new_samples"] == 2 * 6 for r in h)
    assert all(np.isfinite(r["train/sft_loss"]) for r in h)
    # checkpoints load as policies; the aggregated window is saved for resume
    policy, meta = load_checkpoint(summary["checkpoint"])
    assert meta["policy"]["name"] == "tiny_pi0" and (run_dir / "checkpoints" / "latest").exists()
    assert (run_dir / "checkpoints" / "update_000002" / "norm_stats.json").exists()
    data = AggregatedDataset.load(run_dir / "dagger_dataset.npz")
    obs, actions, its = data.arrays()
    assert actions.shape[1:] == (8, 4) and obs["main_images"].shape[1:] == (32, 32, 3)
    assert set(its.tolist()) <= {-1, 0, 1} and (its == 1).sum() == 12
    assert list((run_dir / "tensorboard").iterdir())


def test_hg_dagger_resume_continues_the_iterations(tmp_path):
    """HG-DAgger with a gate that always fires (threshold 0): every chunk is an intervention and
    enters D. A resumed run with more iterations continues from the saved window and checkpoint."""
    first = _run(
        tmp_path,
        "dagger.variant=hg_dagger",
        "dagger.hg_threshold=0.0",
        "dagger.include_demos=false",
        "eval.before=false",
    )
    assert first["variant"] == "hg_dagger" and first["dataset_size"] == 2 * 12
    assert all(r["dagger/expert_fraction"] == 1.0 for r in first["history"])
    second = _run(
        tmp_path,
        "dagger.variant=hg_dagger",
        "dagger.hg_threshold=0.0",
        "dagger.include_demos=false",
        "eval.before=false",
        "dagger.iterations=3",
        "runner.resume=true",
    )
    assert second["iterations"] == 3 and [r["iteration"] for r in second["history"]] == [3]
    assert second["dataset_size"] == 3 * 12


def test_dagger_on_a_chained_env_reports_chain_metrics(tmp_path):
    """CALVIN-style chains: the before / after evaluations also give avg_num_subtasks and
    success_len_1..5 (summary, eval_chain.md, before_after_chain.md), as the PPO fleet's do."""
    import pytest

    pytest.importorskip("pybullet")
    run_dir = tmp_path / "run"
    overrides = [
        "dagger.enabled=true",
        "demos.bootstrap=false",
        "env.max_episode_steps=24",
        "env.image_size=16",
        "policy.dim=32",
        "policy.depth=1",
        "policy.heads=2",
        "dagger.iterations=1",
        "dagger.num_envs=2",
        "dagger.train_steps=2",
        "dagger.batch_size=8",
        "eval.episodes_per_task=2",
        "runner.max_wall_seconds=0",
        f"runner.logger.log_path={run_dir}",
    ]
    assert main(["train", "calvin_d_d_ppo_tinypi0_cpu", *overrides]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("eval_chain", "eval_chain_before"):
        row = summary[key]["all"]
        assert set(row) == {f"success_len_{k}" for k in range(1, 6)} | {"avg_num_subtasks"}
        assert 0.0 <= row["avg_num_subtasks"] <= 5.0
    assert "avg_num_subtasks" in (run_dir / "eval_chain.md").read_text()
    assert "calvin-D before" in (run_dir / "before_after_chain.md").read_text()
