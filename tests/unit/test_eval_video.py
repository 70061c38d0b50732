"""rlfleet.eval.video: MP4s read back with the right frames and size, per-task quota, success/fail names."""

import imageio.v2 as imageio
import numpy as np
import pytest

from rlfleet.config import VideoConfig
from rlfleet.eval.video import EpisodeRecorder, overlay, upscale

TASKS = ["reach-v3", "reach-v3", "push-v3"]


def frames(value: int, b: int = 3, side: int = 64) -> np.ndarray:
    return np.full((b, side, side, 3), value, np.uint8)


def read(path) -> list[np.ndarray]:
    reader = imageio.get_reader(str(path), format="FFMPEG")
    try:
        return [f for f in reader]
    finally:
        reader.close()


def test_config_defaults() -> None:
    cfg = VideoConfig()
    assert (cfg.save_video, cfg.video_base_dir, cfg.fps, cfg.info_overlay, cfg.max_videos_per_task) == (
        False,
        "videos",
        20,
        True,
        1,
    )


def test_upscale_and_overlay() -> None:
    small = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    big = upscale(small)
    assert big.shape == (256, 256, 3) and np.array_equal(big[::4, ::4], small)
    assert upscale(np.zeros((101, 101, 3), np.uint8)).shape == (304, 304, 3)  # x3, padded to even
    ok, bad = overlay(big, "reach-v3", 7, 1.5, True), overlay(big, "reach-v3", 7, 1.5, False)
    assert ok.shape == big.shape and ok.dtype == np.uint8
    assert ok[-1, 0, 1] > ok[-1, 0, 0] and bad[-1, 0, 0] > bad[-1, 0, 1]  # green vs red status bar
    assert not np.array_equal(ok[:20], big[:20])  # text banner drawn at the top


def test_disabled_recorder_is_noop(tmp_path) -> None:
    rec = EpisodeRecorder(VideoConfig(save_video=False), TASKS, root=tmp_path)
    rec.start(None)
    assert rec.step(None, np.ones((3, 2)), np.ones(3, bool), np.ones(3, bool)) == []
    assert not any(tmp_path.iterdir())


def test_records_one_video_per_task(tmp_path) -> None:
    cfg = VideoConfig(save_video=True, max_videos_per_task=1, fps=10)
    rec = EpisodeRecorder(cfg, TASKS, root=tmp_path)
    rec.start(frames(0))
    final = frames(200)
    for t in range(1, 7):
        done = np.array([t == 4, t == 6, t == 2])  # env 1 (reach, not recorded) ends later
        succ = np.array([t == 3, False, False])
        written = rec.step(frames(10 * t), np.ones((3, 2)), succ, done, final_frames=final)
        if t == 2:
            assert written == [tmp_path / "videos" / "push-v3" / "ep0_fail.mp4"]
        elif t == 4:
            assert written == [tmp_path / "videos" / "reach-v3" / "ep0_success.mp4"]
        else:
            assert written == []
    rec.close()
    videos = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert videos == ["videos/push-v3/ep0_fail.mp4", "videos/reach-v3/ep0_success.mp4"]
    reach = read(tmp_path / "videos/reach-v3/ep0_success.mp4")
    assert len(reach) == 5  # first frame, 3 running steps, final frame
    assert reach[0].shape == (256, 256, 3)
    assert len(read(tmp_path / "videos/push-v3/ep0_fail.mp4")) == 3


def test_quota_and_episode_success_override(tmp_path) -> None:
    """One env, two videos allowed: consecutive episodes become ep0 and ep1, then recording stops."""
    cfg = VideoConfig(save_video=True, max_videos_per_task=2, info_overlay=False, video_base_dir=str(tmp_path / "v"))
    rec = EpisodeRecorder(cfg, ["push-v3"], root="/nonexistent")  # absolute base dir wins over root
    rec.start(frames(50, b=1))
    names = []
    for t in range(9):
        done = np.array([t % 3 == 2])
        names += [
            p.name
            for p in rec.step(
                frames(50, b=1),
                np.array([1.0]),
                np.array([False]),
                done,
                final_frames=frames(60, b=1),
                episode_success=np.array([t == 2]),
                episode_length=np.array([3]),
            )
        ]
    assert names == ["ep0_success.mp4", "ep1_fail.mp4"]
    assert sorted(p.name for p in (tmp_path / "v" / "push-v3").iterdir()) == names  # no temp files left
    video = read(tmp_path / "v" / "push-v3" / "ep1_fail.mp4")
    assert len(video) == 4 and video[0].shape == (256, 256, 3)
    assert abs(int(video[0][128, 128, 0]) - 50) <= 4  # no overlay: plain (upscaled) frame


def test_episodes_per_env_and_errors(tmp_path) -> None:
    cfg = VideoConfig(save_video=True, max_videos_per_task=5)
    rec = EpisodeRecorder(cfg, ["reach-v3"], root=tmp_path, episodes_per_env=1)
    rec.start(frames(0, b=1))
    assert len(rec.step(frames(0, b=1), np.zeros(1), np.zeros(1, bool), np.ones(1, bool), frames(0, b=1))) == 1
    assert rec.step(frames(0, b=1), np.zeros(1), np.zeros(1, bool), np.ones(1, bool), frames(0, b=1)) == []
    with pytest.raises(ValueError, match="image_size"):
        rec.step(None, np.zeros(1), np.zeros(1, bool))
    with pytest.raises(ValueError, match="uint8"):
        rec.step(np.zeros((1, 8, 8, 3), np.float32), np.zeros(1), np.zeros(1, bool))
    with pytest.raises(RuntimeError):
        EpisodeRecorder(cfg, ["reach-v3"], root=tmp_path).step(frames(0, b=1), np.zeros(1), np.zeros(1, bool))


@pytest.mark.parametrize("failures, expect_file", [(1, True), (2, False)])
def test_a_failed_write_is_retried_once_then_skipped(tmp_path, monkeypatch, failures, expect_file) -> None:
    """An ffmpeg process that dies costs at most the video, never the evaluation."""
    import rlfleet.eval.video as ev

    real, calls = ev.write_mp4, []

    def flaky(path, video, fps):
        calls.append(path)
        if len(calls) <= failures:
            raise OSError("[Errno 32] Broken pipe")
        return real(path, video, fps)

    monkeypatch.setattr(ev, "write_mp4", flaky)
    rec = EpisodeRecorder(VideoConfig(save_video=True), ["push-v3"], root=tmp_path)
    rec.start(frames(0, b=1))
    written = rec.step(
        frames(50, b=1), np.ones((1, 2)), np.zeros(1, bool), np.ones(1, bool), final_frames=frames(90, b=1)
    )
    path = tmp_path / "videos" / "push-v3" / "ep0_fail.mp4"
    assert len(calls) == min(failures + 1, 2)
    assert written == ([path] if expect_file else []) and path.exists() == expect_file
