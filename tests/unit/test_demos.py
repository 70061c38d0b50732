"""The demo dataset format (`rlfleet-demos/1`) as the one collector writes it for MetaWorld: on-disk
layout, success, reproducibility, atomic writes, failures, read errors."""

import json
from pathlib import Path

import numpy as np
import pytest

from rlfleet.data.demos import (
    DEMO_SEED_BASE,
    FORMAT,
    DemoEpisode,
    drop_noop_frames,
    load_demos,
    noop_frames,
    read_index,
)
from rlfleet.envs.api import EnvConfig, decode_instructions
from rlfleet.envs.metaworld import TASK_DESCRIPTIONS
from rlfleet.runs.collect import collect_env_demos

TASKS = ["reach-v3", "drawer-close-v3"]
SIZE = 32


def _cfg(task: str = ",".join(TASKS), image_size: int = SIZE, max_episode_steps: int = 150) -> EnvConfig:
    return EnvConfig(name="metaworld", task=task, image_size=image_size, max_episode_steps=max_episode_steps)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demos") / "ds"
    summary = collect_env_demos(out, _cfg(), 2, progress=False)
    assert summary == {t: {"episodes": 2, "success": 2, "attempts": 2, "failed": 0} for t in TASKS}
    return out


def test_index(dataset: Path) -> None:
    index = json.loads((dataset / "index.json").read_text())
    assert index == read_index(dataset)
    assert index["format"] == FORMAT
    assert index["env"]["task"] == ",".join(TASKS)
    assert (index["env"]["image_size"], index["env"]["chunk_size"], index["env"]["max_episode_steps"]) == (SIZE, 1, 150)
    assert "T" in index["created"]
    eps = index["episodes"]
    assert [e["id"] for e in eps] == [0, 1, 2, 3]
    assert [e["task"] for e in eps] == TASKS * 2  # one env per task, stepped in rounds
    assert [e["file"] for e in eps] == [f"episodes/ep_{i:06d}.npz" for i in range(4)]
    assert sorted(p.name for p in (dataset / "episodes").iterdir()) == [f"ep_{i:06d}.npz" for i in range(4)]
    for e in eps:
        assert e["instruction"] == TASK_DESCRIPTIONS[e["task"]]
        assert e["success"] is True and 0 <= e["success_step"] < e["length"] <= 150
        # stops 10 steps after the first success (unless the time limit comes first)
        assert e["length"] == min(e["success_step"] + 11, 150)
    assert [e["seed"] for e in eps] == [DEMO_SEED_BASE + i for i in range(4)]  # disjoint from eval seeds
    assert not dataset.with_name(dataset.name + ".tmp").exists()


def test_npz_files(dataset: Path) -> None:
    index = read_index(dataset)
    for e in index["episodes"]:
        L = e["length"]
        with np.load(dataset / e["file"], allow_pickle=False) as z:
            assert sorted(z.files) == [
                "actions", "instruction", "main_images", "rewards", "states", "step_instructions", "success"
            ]  # fmt: skip
            assert z["main_images"].shape == (L, SIZE, SIZE, 3) and z["main_images"].dtype == np.uint8
            assert z["states"].shape == (L, 39) and z["states"].dtype == np.float32
            assert z["actions"].shape == (L, 4) and z["actions"].dtype == np.float32
            assert z["rewards"].shape == (L,) and z["rewards"].dtype == np.float32
            assert z["success"].shape == (L,) and z["success"].dtype == bool
            assert z["instruction"].shape == (128,) and z["instruction"].dtype == np.uint8
            assert np.abs(z["actions"]).max() <= 1.0
            assert z["main_images"].std() > 0  # real frames, not zeros
            success = z["success"]
            assert success.any() and int(np.argmax(success)) == e["success_step"]
            assert decode_instructions(z["instruction"][None]) == [TASK_DESCRIPTIONS[e["task"]]]


def test_load_round_trip(dataset: Path) -> None:
    episodes = load_demos(dataset)
    assert [ep.id for ep in episodes] == [0, 1, 2, 3]
    index = read_index(dataset)
    for ep, e in zip(episodes, index["episodes"]):
        assert isinstance(ep, DemoEpisode)
        assert (ep.task, ep.seed, ep.success, ep.success_step, ep.length) == (
            e["task"],
            e["seed"],
            e["success"],
            e["success_step"],
            e["length"],
        )
        assert ep.instruction_text == TASK_DESCRIPTIONS[ep.task]
        assert decode_instructions(ep.instruction[None]) == [ep.instruction_text]
        with np.load(dataset / e["file"], allow_pickle=False) as z:
            np.testing.assert_array_equal(ep.states, z["states"])
            np.testing.assert_array_equal(ep.actions, z["actions"])
            np.testing.assert_array_equal(ep.main_images, z["main_images"])
            np.testing.assert_array_equal(ep.step_success, z["success"])
        # consecutive states differ: the expert moves the arm
        assert np.abs(np.diff(ep.states[:, :3], axis=0)).sum() > 0.01


def test_reproducible(dataset: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    collect_env_demos(again, _cfg(), 2, progress=False)
    first, second = load_demos(dataset), load_demos(again)
    assert [e.seed for e in first] == [e.seed for e in second]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.main_images, b.main_images)
    # different episodes of one task get different initial layouts
    assert not np.array_equal(first[0].states[0], first[2].states[0])


def test_existing_output_and_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    (out / "marker").write_text("old")
    short = _cfg("reach-v3", image_size=0, max_episode_steps=3)
    with pytest.raises(FileExistsError, match="overwrite"):
        collect_env_demos(out, short, 1, progress=False)
    assert (out / "marker").exists()
    collect_env_demos(out, short, 1, keep_failed=True, overwrite=True, progress=False)
    assert not (out / "marker").exists() and (out / "index.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no .tmp left behind
    ep = load_demos(out, only_success=False)[0]
    assert ep.main_images is None  # image_size 0: state-only dataset
    with np.load(out / "episodes" / "ep_000000.npz", allow_pickle=False) as z:
        assert "main_images" not in z.files


def test_failed_episodes(tmp_path: Path) -> None:
    # 3 steps is far too short for the expert: every attempt fails (3 attempts per wanted episode)
    summary = collect_env_demos(tmp_path / "drop", _cfg(image_size=0, max_episode_steps=3), 2, progress=False)
    assert summary == {t: {"episodes": 0, "success": 0, "attempts": 6, "failed": 6} for t in TASKS}
    assert read_index(tmp_path / "drop")["episodes"] == []
    assert load_demos(tmp_path / "drop") == []

    summary = collect_env_demos(
        tmp_path / "keep", _cfg("reach-v3", image_size=0, max_episode_steps=3), 1, keep_failed=True, progress=False
    )
    assert summary == {"reach-v3": {"episodes": 3, "success": 0, "attempts": 3, "failed": 3}}
    index = read_index(tmp_path / "keep")
    assert [(e["success"], e["success_step"], e["length"]) for e in index["episodes"]] == [(False, -1, 3)] * 3
    assert [e["seed"] for e in index["episodes"]] == [DEMO_SEED_BASE + r for r in range(3)]
    assert load_demos(tmp_path / "keep") == []
    kept = load_demos(tmp_path / "keep", only_success=False)
    assert len(kept) == 3 and not any(ep.success for ep in kept)
    assert all(not ep.step_success.any() for ep in kept)


def test_read_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_index(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty.*index\.json"):
        load_demos(tmp_path / "empty")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "index.json").write_text(json.dumps({"format": "something-else/3"}))
    with pytest.raises(ValueError, match="format"):
        read_index(tmp_path / "other")


def test_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reach-v9"):
        collect_env_demos(tmp_path / "x", _cfg("reach-v9"), 1, progress=False)
    with pytest.raises(ValueError, match="episodes_per_task"):
        collect_env_demos(tmp_path / "x", _cfg("reach-v3"), 0, progress=False)
    assert not any(tmp_path.iterdir())


def test_env_error_leaves_nothing(tmp_path: Path) -> None:
    # the camera is only checked when the env is built: neither the dataset nor its temporary folder may remain
    with pytest.raises(ValueError, match="camera"):
        collect_env_demos(tmp_path / "ds", EnvConfig(task="reach-v3", image_size=16, camera="nope"), 1, progress=False)
    assert not any(tmp_path.iterdir())


def test_noop_frames_are_the_experts_waits() -> None:
    """Two arms, grippers at dims 3 and 7: a frame is a no-op when nothing moves and neither
    gripper command changes; a gripper switch, the first frame and the frames from the first
    success on are kept."""
    o, c, m = -1.0, 1.0, 0.5
    actions = np.array(
        [
            [0, 0, 0, o, 0, 0, 0, o],  # 0: first frame, kept though it moves nothing
            [m, 0, 0, o, 0, 0, 0, o],  # 1: moves
            [0, 0, 0, o, 0, 0, 0, o],  # 2: waits for the arm
            [0, 0, 0, o, 0, 0, 5e-4, o],  # 3: waits (within tol)
            [0, 0, 0, o, 0, 0, 0, c],  # 4: right gripper closes: kept
            [0, 0, 0, o, 0, 0, 0, c],  # 5: holds while the fingers close
            [0, 0, 0, o, 0, 0, m, c],  # 6: lifts
            [0, 0, 0, o, 0, 0, 0, c],  # 7: first success
            [0, 0, 0, o, 0, 0, 0, c],  # 8: holds still after it: kept
        ],
        np.float32,
    )
    expected = [False, False, True, True, False, True, False, False, False]
    np.testing.assert_array_equal(noop_frames(actions, (3, 7), keep_from=7), expected)
    expected_without_success = expected[:7] + [True, True]
    np.testing.assert_array_equal(noop_frames(actions, (3, 7)), expected_without_success)
    with pytest.raises(ValueError, match="gripper dims"):
        noop_frames(actions, (8,))
    with pytest.raises(ValueError, match="action_dim"):
        noop_frames(actions[0], (3,))


def test_drop_noop_frames_cuts_every_per_step_array() -> None:
    L = 6
    actions = np.zeros((L, 4), np.float32)
    actions[[1, 4], 0] = 0.5  # frames 2, 3 wait; 5 is the success
    episode = DemoEpisode(
        id=0,
        task="reach-v3",
        instruction_text="reach",
        seed=0,
        success=True,
        success_step=5,
        states=np.arange(L, dtype=np.float32)[:, None].repeat(39, 1),
        actions=actions,
        rewards=np.arange(L, dtype=np.float32),
        step_success=np.arange(L) >= 5,
        instruction=np.zeros(128, np.uint8),
        main_images=np.arange(L, dtype=np.uint8)[:, None, None, None].repeat(4, 1).repeat(4, 2).repeat(3, 3),
        wrist_images=np.arange(L, dtype=np.uint8)[:, None, None, None].repeat(2, 1).repeat(2, 2).repeat(3, 3),
        step_instructions=np.arange(L, dtype=np.uint8)[:, None].repeat(128, 1),
    )
    out = drop_noop_frames(episode, (3,))
    kept = [0, 1, 4, 5]
    assert out.length == 4 and out.success_step == 3 and out.step_success[out.success_step]
    np.testing.assert_array_equal(out.states[:, 0], kept)
    np.testing.assert_array_equal(out.rewards, kept)
    np.testing.assert_array_equal(out.main_images[:, 0, 0, 0], kept)
    np.testing.assert_array_equal(out.wrist_images[:, 0, 0, 0], kept)
    np.testing.assert_array_equal(out.step_instructions[:, 0], kept)
    np.testing.assert_array_equal(out.actions, actions[kept])
    moving = DemoEpisode(**{**episode.__dict__, "actions": np.full((L, 4), 0.5, np.float32)})
    assert drop_noop_frames(moving, (3,)) is moving
