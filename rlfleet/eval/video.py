"""Evaluation videos: MP4s of a few episodes per task, written as the env batch runs.

Why: a success rate says *whether* a policy works, a video says *how* it fails. The recorder is
fed one frame per env per chunk (the `main_images` the policy already sees, so no extra
rendering), buffers only the episodes it will keep (at most `max_videos_per_task` per task) and
writes `<video_base_dir>/<task>/ep<k>_success.mp4` or `..._fail.mp4` when an episode ends.
Frames as small as 64x64 are upscaled (nearest neighbour) to at least 256 px so the optional
text overlay stays readable. Files appear atomically (temp name, then rename).

Needs `imageio` with the `imageio-ffmpeg` backend only when `save_video` is on; the overlay uses
Pillow when installed and falls back to a plain green/red status bar otherwise.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.config import VideoConfig

log = logging.getLogger(__name__)

try:  # Pillow ships with imageio/tensorboard; without it the overlay is a colour bar only.
    from PIL import Image, ImageDraw, ImageFont

    _HAVE_PIL = True
except ImportError:  # pragma: no cover - depends on the environment
    _HAVE_PIL = False

MIN_VIDEO_SIDE = 256  # frames are upscaled by an integer factor to at least this many pixels
_GREEN = np.array([40, 190, 60], np.uint8)
_RED = np.array([210, 50, 40], np.uint8)


# --- frames ----------------------------------------------------------------------------------


def upscale(frame: np.ndarray, min_side: int = MIN_VIDEO_SIDE) -> np.ndarray:
    """Nearest-neighbour upscale by an integer factor to >= `min_side`, padded to even sides (H.264 needs them)."""
    h, w = frame.shape[:2]
    factor = max(1, math.ceil(min_side / min(h, w)))
    out = np.repeat(np.repeat(frame, factor, axis=0), factor, axis=1) if factor > 1 else frame
    pad_h, pad_w = out.shape[0] % 2, out.shape[1] % 2
    if pad_h or pad_w:
        out = np.pad(out, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return np.ascontiguousarray(out)


_FONT_CACHE: dict[int, Any] = {}


def _font(size: int) -> Any:
    if size not in _FONT_CACHE:
        try:
            _FONT_CACHE[size] = ImageFont.load_default(size=size)  # scalable font (Pillow >= 10.1 + FreeType)
        except (TypeError, OSError, ImportError):  # older Pillow / no FreeType: fixed bitmap font
            _FONT_CACHE[size] = ImageFont.load_default()
    return _FONT_CACHE[size]


def overlay(frame: np.ndarray, task: str, step: int, cum_reward: float, success: bool) -> np.ndarray:
    """Draw the episode's status onto an (already upscaled) frame: a green/red bar, plus text with Pillow."""
    out = frame.copy()
    h, w = out.shape[:2]
    bar = max(4, h // 32)
    out[h - bar :] = _GREEN if success else _RED
    if not _HAVE_PIL:
        return out
    size = max(11, w // 20)
    font = _font(size)
    lines = [task, f"step {step}  R {cum_reward:.1f}", "success" if success else "no success yet"]
    img = Image.fromarray(out)
    draw = ImageDraw.Draw(img, "RGBA")
    line_h = size + 3
    draw.rectangle([0, 0, w, 4 + line_h * len(lines)], fill=(0, 0, 0, 140))
    for k, text in enumerate(lines):
        colour = (255, 255, 255, 255) if k < 2 else ((90, 230, 110, 255) if success else (255, 120, 100, 255))
        draw.text((4, 2 + k * line_h), text, fill=colour, font=font)
    return np.asarray(img)


# --- writing -----------------------------------------------------------------------------------


def write_mp4(path: Path, frames: list[np.ndarray], fps: int) -> Path:
    """Encode uint8 [H,W,3] frames (even sides) as H.264 MP4 at `path`, atomically."""
    import imageio.v2 as imageio  # deferred: only needed when videos are on

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.mp4")
    try:
        writer = imageio.get_writer(
            str(tmp),
            format="FFMPEG",
            mode="I",
            fps=fps,
            codec="libx264",
            pixelformat="yuv420p",
            macro_block_size=2,
            quality=7,
            ffmpeg_log_level="error",
        )
        try:
            for frame in frames:
                writer.append_data(frame)
        finally:
            writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _check_ffmpeg() -> None:
    """Fail at construction, not after a whole eval, when the MP4 encoder is missing."""
    missing = [m for m in ("imageio", "imageio_ffmpeg") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(
            f"save_video needs imageio with the ffmpeg backend (missing {missing}): "
            "pip install 'imageio-ffmpeg>=0.5,<0.7'"
        )


# --- recorder ----------------------------------------------------------------------------------


class _Episode:
    """Frames (raw size) and the status shown with each, for one env's current recorded episode."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []
        self.info: list[tuple[int, float, bool]] = []  # (step, cumulative reward, success so far)
        self.reward = 0.0
        self.success = False

    def add(self, frame: np.ndarray, step: int) -> None:
        self.frames.append(np.array(frame, np.uint8, copy=True))
        self.info.append((step, self.reward, self.success))


class EpisodeRecorder:
    """Turns per-step frames of a batch of auto-resetting envs into a few MP4s per task.

    Call `start(frames)` with the frames of the first observation, then `step(...)` after every
    `chunk_step`, then `close()` (unfinished episodes are dropped: a video shows a whole episode).
    With `save_video` off every call is a no-op, so callers need no branches.

    Which episodes: at every episode start (the first one and each auto-reset) an env starts
    recording if its task still has room (`written + being recorded < max_videos_per_task`) and
    the env has recorded fewer than `episodes_per_env` episodes (None: no limit). Pass
    `episodes_per_env=1` when, as in `evaluate_policy`, only each env's first episode counts.
    """

    def __init__(
        self,
        cfg: VideoConfig,
        task_names: list[str],
        root: Path | str | None = None,
        episodes_per_env: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.task_names = list(task_names)
        base = Path(cfg.video_base_dir)
        self.base_dir = base if base.is_absolute() or root is None else Path(root) / base
        self.episodes_per_env = episodes_per_env
        self.enabled = bool(cfg.save_video) and cfg.max_videos_per_task > 0
        if self.enabled:
            _check_ffmpeg()
        n = len(self.task_names)
        self._episodes: list[_Episode | None] = [None] * n
        self._steps = np.zeros(n, np.int64)
        self._recorded_by_env = np.zeros(n, np.int64)
        self._written: dict[str, int] = {}
        self.written: list[Path] = []  # every video written so far, in order
        self._started = False

    # -- bookkeeping --

    def _active(self, task: str) -> int:
        return sum(1 for i, ep in enumerate(self._episodes) if ep is not None and self.task_names[i] == task)

    def _maybe_begin(self, i: int, frame: np.ndarray) -> None:
        """Start recording env i's new episode (first frame `frame`) if its task and env have room."""
        task = self.task_names[i]
        if self.episodes_per_env is not None and self._recorded_by_env[i] >= self.episodes_per_env:
            return
        if self._written.get(task, 0) + self._active(task) >= self.cfg.max_videos_per_task:
            return
        ep = _Episode()
        ep.add(frame, 0)
        self._episodes[i] = ep
        self._recorded_by_env[i] += 1

    def _check_frames(self, frames: np.ndarray | None) -> np.ndarray:
        if frames is None:
            raise ValueError(
                "save_video needs camera frames (obs['main_images']), which the env renders only at "
                "env.image_size > 0 (a run's setting; rlfleet eval plays the checkpoint's env)"
            )
        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[0] != len(self.task_names) or frames.shape[-1] != 3:
            raise ValueError(f"frames must be [B={len(self.task_names)},H,W,3], got {frames.shape}")
        if frames.dtype != np.uint8:
            raise ValueError(f"frames must be uint8, got {frames.dtype}")
        return frames

    # -- public API --

    def start(self, frames: np.ndarray | None) -> None:
        """Begin with the first observation's frames [B,H,W,3] uint8 (after `env.reset`)."""
        if not self.enabled:
            return
        frames = self._check_frames(frames)
        self._started = True
        for i in range(len(self.task_names)):
            self._maybe_begin(i, frames[i])

    def step(
        self,
        frames: np.ndarray | None,
        rewards: np.ndarray,
        success: np.ndarray,
        done: np.ndarray | None = None,
        final_frames: np.ndarray | None = None,
        episode_success: np.ndarray | None = None,
        episode_length: np.ndarray | None = None,
    ) -> list[Path]:
        """Record one chunk step of every env; returns the videos written by this call.

        frames: [B,H,W,3] uint8 after the step (`res.obs["main_images"]`; for an env whose
        episode ended this is already the next episode's first frame). rewards: [B] or [B,K]
        (summed over K; K also advances the step counter). success: [B] bool, success during
        this step. done: [B] bool, episode ended during this step (None: no env ended).
        final_frames: [B,H,W,3], the frame each finished episode ended in
        (`res.final_obs["main_images"]`; None: the video stops at the previous frame).
        episode_success / episode_length: [B], the finished episode's `success_once` and length,
        which name the file and label the last frame (default: success seen by the recorder).
        """
        if not self.enabled:
            return []
        if not self._started:
            raise RuntimeError("EpisodeRecorder.step before start(first frames)")
        frames = self._check_frames(frames)
        rewards = np.asarray(rewards, np.float64)
        n = len(self.task_names)
        k = rewards.shape[1] if rewards.ndim == 2 else 1
        step_reward = rewards.reshape(n, -1).sum(axis=1)
        success = np.asarray(success, bool).reshape(n)
        done = np.zeros(n, bool) if done is None else np.asarray(done, bool).reshape(n)
        written: list[Path] = []
        for i in range(n):
            if done[i]:
                ep = self._episodes[i]
                if ep is not None:
                    ep.reward += float(step_reward[i])
                    if episode_success is not None:
                        ep.success = bool(episode_success[i])
                    else:
                        ep.success = ep.success or bool(success[i])
                    if final_frames is not None:
                        last = int(episode_length[i]) if episode_length is not None else int(self._steps[i]) + k
                        ep.add(final_frames[i], last)
                    path = self._finish(i, ep)
                    if path is not None:
                        written.append(path)
                    self._episodes[i] = None
                self._steps[i] = 0
                self._maybe_begin(i, frames[i])
            else:
                self._steps[i] += k
                ep = self._episodes[i]
                if ep is not None:
                    ep.reward += float(step_reward[i])
                    ep.success = ep.success or bool(success[i])
                    ep.add(frames[i], int(self._steps[i]))
        return written

    def _finish(self, i: int, ep: _Episode) -> Path | None:
        task = self.task_names[i]
        index = self._written.get(task, 0)
        self._written[task] = index + 1
        label = "success" if ep.success else "fail"
        video = []
        for frame, (step, reward, succ) in zip(ep.frames, ep.info):
            big = upscale(frame)
            video.append(overlay(big, task, step, reward, succ) if self.cfg.info_overlay else big)
        path = self.base_dir / task / f"ep{index}_{label}.mp4"
        for attempt in (1, 2):  # an ffmpeg process can die under load (seen once in a full test run)
            try:
                write_mp4(path, video, self.cfg.fps)
                break
            except OSError as exc:
                log.warning("writing %s failed (attempt %d): %s", path, attempt, str(exc).splitlines()[0])
        else:
            return None  # a lost video must not cost the evaluation it illustrates
        self.written.append(path)
        return path

    def close(self) -> None:
        """Drop episodes still running (a video always shows a whole episode)."""
        self._episodes = [None] * len(self.task_names)

    def __enter__(self) -> EpisodeRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
