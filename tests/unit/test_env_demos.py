"""Demo collection from envs with built-in experts (`rlfleet.runs.collect`), on the RoboTwin-style
env (state-only, so no renderer is needed), read back and turned into SFT samples."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlfleet.data.demos import load_demos, read_index
from rlfleet.envs import registry
from rlfleet.envs.api import ChunkedEnv, EnvConfig, EnvSpec, decode_instructions
from rlfleet.runs.collect import STOP_AFTER_SUCCESS, collect_env_demos
from rlfleet.runs.sft import build_sft_data

pytest.importorskip("sapien")

TASKS = "click_bell,place_empty_cup"


def test_collect_writes_successful_expert_episodes(tmp_path):
    cfg = EnvConfig(name="robotwin", task=TASKS, max_episode_steps=200)
    summary = collect_env_demos(tmp_path / "demos", cfg, episodes_per_task=2, progress=False)
    assert summary == {t: {"episodes": 2, "success": 2, "attempts": 2, "failed": 0} for t in TASKS.split(",")}
    index = read_index(tmp_path / "demos")
    assert index["env"]["chunk_size"] == 1
    seeds = [e["seed"] for e in index["episodes"]]
    assert len(set(seeds)) == len(seeds) and min(seeds) >= 1_000_000
    episodes = load_demos(tmp_path / "demos")
    assert [e.task for e in episodes].count("click_bell") == 2
    for ep in episodes:
        # recording stops STOP_AFTER_SUCCESS steps after the first success
        assert ep.success and ep.length == ep.success_step + 1 + STOP_AFTER_SUCCESS
        assert ep.step_instructions.shape == (ep.length, 128)
        assert decode_instructions(ep.step_instructions[:1])[0] == ep.instruction_text
        assert np.abs(ep.actions).max() <= 1.0
    data = build_sft_data(episodes, chunk_size=4)
    assert len(data) == sum(e.length for e in episodes)
    assert data.obs["instructions"].shape == (len(data), 128)


def test_existing_folder_is_kept_unless_overwrite(tmp_path):
    (tmp_path / "demos").mkdir()
    cfg = EnvConfig(name="robotwin", task="click_bell", max_episode_steps=100)
    with pytest.raises(FileExistsError, match="overwrite"):
        collect_env_demos(tmp_path / "demos", cfg, 1, progress=False)


class _NoExpertEnv(ChunkedEnv):
    spec = EnvSpec(state_dim=1, action_dim=1, chunk_size=1, num_envs=1, max_episode_steps=5, task_names=["t"])

    def reset(self, seeds=None):
        return {}

    def chunk_step(self, actions):
        raise AssertionError("not stepped")

    def close(self):
        pass


def test_env_without_experts_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "no_expert", lambda cfg, n, off: _NoExpertEnv())
    with pytest.raises(ValueError, match="no scripted experts"):
        collect_env_demos(tmp_path / "demos", EnvConfig(name="no_expert"), 1, progress=False)
    assert not (tmp_path / "demos").exists() and not (tmp_path / "demos.tmp").exists()


def test_calvin_chain_demo_switches_instructions(tmp_path):
    pytest.importorskip("pybullet")
    cfg = EnvConfig(name="calvin", task="D", max_episode_steps=1800)
    summary = collect_env_demos(tmp_path / "chains", cfg, episodes_per_task=1, progress=False)
    assert summary["calvin-D"]["success"] == 1
    (ep,) = load_demos(tmp_path / "chains")
    texts = list(dict.fromkeys(decode_instructions(ep.step_instructions)))
    assert len(texts) == 5 and ep.instruction_text == " | ".join(texts)  # one per subtask of the chain
    assert ep.rewards.sum() == 5 and ep.states.shape[1] == 39 and ep.actions.shape[1] == 7


def test_wrist_camera_demos_hold_wrist_images_and_train_a_wrist_policy(tmp_path):
    pytest.importorskip("pybullet")
    from rlfleet.cli import main
    from rlfleet.config import SFTConfig
    from rlfleet.runs.sft import run_sft

    argv = ["collect", "--env", "calvin", "--tasks", "D", "--episodes-per-task", "1", "--out", str(tmp_path / "wrist")]
    assert main([*argv, "--image-size", "16", "--max-episode-steps", "1800", "--wrist-camera"]) == 0
    cfg = EnvConfig(name="calvin", task="D", max_episode_steps=1800, image_size=16, wrist_camera=True)
    assert read_index(tmp_path / "wrist")["env"]["wrist_camera"] is True
    (ep,) = load_demos(tmp_path / "wrist")
    assert ep.wrist_images.shape == ep.main_images.shape == (ep.length, 16, 16, 3)
    assert not np.array_equal(ep.wrist_images, ep.main_images)
    policy = {"name": "tiny_pi0", "depth": 1, "proprio_dims": 15, "unnorm_key": "calvin", "wrist_camera": True}
    sft = SFTConfig(steps=3, batch_size=8, eval_episodes_per_task=0)
    run_sft(tmp_path / "wrist", tmp_path / "ckpt", policy, cfg, sft, progress=False)
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["policy"]["wrist_camera"] is True
    # demos without the wrist camera cannot teach a policy that reads it
    plain = EnvConfig(name="calvin", task="D", max_episode_steps=1800, image_size=16)
    collect_env_demos(tmp_path / "plain", plain, episodes_per_task=1, progress=False)
    with pytest.raises(ValueError, match="reads wrist_images but the demos in .* hold none"):
        run_sft(tmp_path / "plain", tmp_path / "ckpt2", policy, cfg, sft, progress=False)


def test_metaworld_goes_through_the_same_collector(tmp_path):
    """One collector for every simulator: MetaWorld's experts drive the env batch like the others."""
    pytest.importorskip("metaworld")
    cfg = EnvConfig(name="metaworld", task="reach-v3,drawer-close-v3", max_episode_steps=150, image_size=0)
    summary = collect_env_demos(tmp_path / "mw", cfg, 1, progress=False)
    assert {t: s["episodes"] for t, s in summary.items()} == {"reach-v3": 1, "drawer-close-v3": 1}
    episodes = load_demos(tmp_path / "mw")
    assert sorted(e.task for e in episodes) == ["drawer-close-v3", "reach-v3"]
    for ep in episodes:
        assert ep.states.shape[1] == 39 and ep.actions.shape[1] == 4 and ep.success and ep.step_success.any()


def test_cli_collect_runs_envs_per_task_together(tmp_path):
    from rlfleet.cli import main

    out = tmp_path / "demos"
    argv = ["collect", "--env", "robotwin", "--tasks", "click_bell", "--episodes-per-task", "2"]
    argv += ["--out", str(out), "--image-size", "0", "--max-episode-steps", "200"]
    assert main([*argv, "--envs-per-task", "2"]) == 0
    index = read_index(out)
    assert index["collect"]["envs_per_task"] == 2
    assert sum(e["success"] for e in index["episodes"]) == 2


def test_cli_collect_flags_left_out_take_the_schema_defaults(tmp_path):
    """One place per default: `rlfleet collect` without --episodes-per-task, --seed, --camera or
    --max-episode-steps collects what DemosConfig and EnvConfig say, not defaults of its own."""
    pytest.importorskip("metaworld")
    from rlfleet.cli import main
    from rlfleet.config import DemosConfig

    out = tmp_path / "demos"
    assert main(["collect", "--tasks", "reach-v3", "--image-size", "0", "--out", str(out)]) == 0
    index = read_index(out)
    assert index["collect"]["episodes_per_task"] == DemosConfig.episodes_per_task
    assert index["collect"]["seed"] == DemosConfig.seed
    assert sum(e["success"] for e in index["episodes"]) == DemosConfig.episodes_per_task
    assert index["env"]["max_episode_steps"] == EnvConfig.max_episode_steps
    assert index["env"]["camera"] == EnvConfig.camera


def test_cli_collect_refuses_a_zero_episode_limit_in_one_line(tmp_path, caplog):
    from rlfleet.cli import main

    argv = ["collect", "--tasks", "reach-v3", "--image-size", "0", "--max-episode-steps", "0"]
    assert main([*argv, "--out", str(tmp_path / "d")]) == 2
    assert "max_episode_steps must be >= 1" in caplog.text
