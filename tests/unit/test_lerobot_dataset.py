"""LeRobot v3 datasets (rlfleet.data.lerobot): a written dataset reads back as it was written,
feature names map by a written mapping, `hf://datasets/...` reads through a local Hugging Face
cache, `rlfleet collect --format lerobot` writes one and `rlfleet sft` trains from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from rlfleet.data.demos import DemoEpisode, load_demos  # noqa: E402
from rlfleet.data.lerobot import read_lerobot, write_lerobot  # noqa: E402
from rlfleet.envs.api import encode_instructions  # noqa: E402


def _episodes(images: bool = True) -> list[DemoEpisode]:
    rng = np.random.default_rng(0)
    out = []
    for i, length in enumerate([5, 8, 3]):
        task = ["pick the cube", "place it"][i % 2]
        success = np.arange(length) >= length - 2 if i != 2 else np.zeros(length, bool)
        out.append(
            DemoEpisode(
                id=i,
                task=task,
                instruction_text=task,
                seed=i,
                success=bool(success.any()),
                success_step=int(np.argmax(success)) if success.any() else -1,
                states=rng.normal(size=(length, 3)).astype(np.float32),
                actions=rng.uniform(-1, 1, (length, 2)).astype(np.float32),
                rewards=rng.normal(size=length).astype(np.float32),
                step_success=success,
                instruction=encode_instructions([task])[0],
                # smooth frames (a gradient per episode): what cameras see, and what H.264 keeps
                main_images=np.stack(
                    [
                        np.full((16, 16, 3), 20 * i + 10 * t, np.uint8) + np.arange(16, dtype=np.uint8)[:, None, None]
                        for t in range(length)
                    ]
                )
                if images
                else None,
            )
        )
    return out


def test_a_written_dataset_reads_back_as_written(tmp_path) -> None:
    episodes = _episodes()
    folder = write_lerobot(tmp_path / "ds", episodes, fps=10)
    info = json.loads((folder / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 3 and info["total_frames"] == 16
    assert info["features"]["observation.images.main"]["dtype"] == "video"
    assert (folder / "videos" / "observation.images.main" / "chunk-000" / "file-000.mp4").is_file()
    back = read_lerobot(folder)
    assert [ep.task for ep in back] == ["pick the cube", "place it", "pick the cube"]
    for a, b in zip(episodes, back):
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.rewards, b.rewards)
        np.testing.assert_array_equal(a.step_success, b.step_success)
        assert (a.success, a.success_step) == (b.success, b.success_step)
        assert b.main_images.shape == a.main_images.shape
        assert np.abs(b.main_images.astype(int) - a.main_images).max() <= 3  # colour conversion rounding
    # load_demos reads either format: the failed third episode is left out by default
    assert [ep.id for ep in load_demos(folder)] == [0, 1]
    small = read_lerobot(folder, image_size=8)  # resized to the env's image size on read
    assert small[0].main_images.shape == (5, 8, 8, 3)
    assert read_lerobot(folder, cameras=())[0].main_images is None  # a state-only policy decodes nothing


def test_feature_names_map_by_a_written_mapping(tmp_path) -> None:
    folder = write_lerobot(tmp_path / "ds", _episodes(images=False))
    back = read_lerobot(folder, {"states": ["observation.state", "next.reward"]})  # concatenated in order
    assert back[0].states.shape == (5, 4)
    np.testing.assert_array_equal(back[0].states[:, 3], back[0].rewards)
    with pytest.raises(
        ValueError, match="demos.features.states: the dataset has no feature observation.joints; it has"
    ):
        read_lerobot(folder, {"states": "observation.joints"})
    with pytest.raises(ValueError, match="unknown rlfleet keys"):
        read_lerobot(folder, {"joints": "observation.state"})


def test_missing_and_foreign_datasets_are_one_line(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_lerobot(tmp_path / "nowhere")
    old = tmp_path / "old"
    (old / "meta").mkdir(parents=True)
    (old / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v2.1"}))
    with pytest.raises(ValueError, match="format v2.1; rlfleet reads v3.x"):
        read_lerobot(old)


def _lay_dataset_cache(cache: Path, repo_id: str, folder: Path, commit: str) -> None:
    """huggingface_hub's cache layout for a dataset repository: datasets--ORG--NAME/snapshots/COMMIT
    (files linked to blobs) and refs/main, as snapshot_download leaves it."""
    root = cache / ("datasets--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True)
    for i, src in enumerate(sorted(p for p in folder.rglob("*") if p.is_file())):
        blob = root / "blobs" / f"{i:040x}"
        shutil.copyfile(src, blob)
        link = snap / src.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)


def _cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def test_collect_writes_a_lerobot_dataset_and_sft_trains_from_it_through_hf_datasets(tmp_path) -> None:
    pytest.importorskip("metaworld")
    demos = tmp_path / "reach"
    res = _cli(
        "collect", "--env", "metaworld", "--tasks", "reach-v3", "--episodes-per-task", "2", "--image-size", "0",
        "--out", str(demos), "--format", "lerobot",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((demos / "meta" / "info.json").read_text())["total_episodes"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name != "reach"]  # the staging folder is gone
    cache = tmp_path / "hf" / "hub"
    _lay_dataset_cache(cache, "acme/reach-demos", demos, "c" * 40)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    ckpt = tmp_path / "ckpt"
    res = _cli(
        "sft", "metaworld_reach_ppo", "--demos", "hf://datasets/acme/reach-demos", "--out", str(ckpt),
        "sft.steps=20", env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert (ckpt / "model.safetensors").is_file()
    assert json.loads((ckpt / "sft_log.json").read_text())["episodes"] == 2
    res = _cli(
        "sft", "metaworld_reach_ppo", "--demos", "hf://datasets/acme/other", "--out", str(tmp_path / "x"), env=env
    )
    assert res.returncode == 2 and "not in the local Hugging Face cache" in res.stderr


def test_a_pixel_policy_trains_from_a_lerobot_datasets_video(tmp_path) -> None:
    pytest.importorskip("metaworld")
    demos = tmp_path / "reach"
    res = _cli(
        "collect", "--env", "metaworld", "--tasks", "reach-v3", "--episodes-per-task", "1", "--image-size", "64",
        "--out", str(demos), "--format", "lerobot",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert (demos / "videos" / "observation.images.main" / "chunk-000" / "file-000.mp4").is_file()
    res = _cli(
        "sft", "metaworld_quickstart_tinyoft", "--demos", str(demos), "--out", str(tmp_path / "ckpt"),
        "sft.steps=3", "env.task=reach-v3",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()


def test_lerobots_own_reader_reads_ours(tmp_path) -> None:
    """Where LeRobot installs (Python >= 3.12, torch < 2.12 for its current releases), its
    LeRobotDataset reads what rlfleet writes."""
    datasets = pytest.importorskip("lerobot.datasets.lerobot_dataset")
    episodes = _episodes()
    folder = write_lerobot(tmp_path / "ds", episodes, fps=10)
    ds = datasets.LeRobotDataset("local/ds", root=folder)
    assert ds.num_episodes == 3 and ds.num_frames == 16
    item = ds[0]
    np.testing.assert_allclose(item["observation.state"].numpy(), episodes[0].states[0])
    np.testing.assert_allclose(item["action"].numpy(), episodes[0].actions[0])
