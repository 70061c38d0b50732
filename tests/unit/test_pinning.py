"""A run's policy settings pinned to one Hub commit, across lives (rlfleet.policies.pinning)."""

from __future__ import annotations

import json

import pytest

from rlfleet.policies import pinning

OLD, NEW = "a" * 40, "b" * 40


@pytest.fixture
def branch_moved(monkeypatch):
    """The Hub branch now points at NEW: pinning an unpinned path gives @NEW."""
    monkeypatch.setattr(pinning, "pin_model_path", lambda p: p if "@" in p else f"{p}@{NEW}")


def test_a_fresh_run_pins_the_branch_and_a_resume_keeps_its_first_commit(tmp_path, branch_moved):
    assert pinning.starting_checkpoint("hf://org/sft", tmp_path, resume=False) == f"hf://org/sft@{NEW}"
    spec = {"state_dim": 3, "action_dim": 2, "logprob_shape": [], "extra_outputs": {}}
    spec |= {"policy": {"name": "gaussian_mlp", "model_path": f"hf://org/sft@{OLD}"}, "resumed_from_env_steps": 64}
    (tmp_path / "run_spec.json").write_text(json.dumps(spec))
    assert pinning.starting_checkpoint("hf://org/sft", tmp_path, resume=True) == f"hf://org/sft@{OLD}"
    # another repository, or no resume: the path as given, pinned now
    assert pinning.starting_checkpoint("hf://org/other", tmp_path, resume=True) == f"hf://org/other@{NEW}"
    assert pinning.starting_checkpoint("hf://org/sft", tmp_path, resume=False) == f"hf://org/sft@{NEW}"


def test_a_run_folder_from_before_the_run_spec_keeps_the_commit_its_config_yaml_recorded(tmp_path, branch_moved):
    """Before the run spec the learner wrote the pinned path into config.yaml; resuming such a
    folder (an image upgrade under `--resume`) must not move the start to the branch's new commit."""
    (tmp_path / "config.yaml").write_text(f"policy:\n  name: gaussian_mlp\n  model_path: hf://org/sft@{OLD}\n")
    assert pinning.starting_checkpoint("hf://org/sft", tmp_path, resume=True) == f"hf://org/sft@{OLD}"
    (tmp_path / "config.yaml").write_text("runner:\n  seed: 0\n")  # nothing recorded: pinned now
    assert pinning.starting_checkpoint("hf://org/sft", tmp_path, resume=True) == f"hf://org/sft@{NEW}"
