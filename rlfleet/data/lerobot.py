"""LeRobot datasets (on-disk format v3.0) as demonstrations: read for `rlfleet sft`, written by
`rlfleet collect --format lerobot`.

LeRobot's own reader (the `lerobot` package) pins Python >= 3.12 and torch < 2.12 in its current
releases, so it is not a dependency: this module implements the format with the libraries it is
built on, pyarrow (parquet) and ffmpeg (mp4, through imageio-ffmpeg), behind the [lerobot] extra.

The format (LeRobot's `CODEBASE_VERSION = "v3.0"`)::

    DATASET/
      meta/info.json                              codebase_version, fps, features, path templates
      meta/stats.json                             per-feature mean/std/min/max (written, not read)
      meta/tasks.parquet                          task (text) <-> task_index
      meta/episodes/chunk-000/file-000.parquet    one row per episode: episode_index, tasks, length,
                                                  dataset_from_index/to_index, data/{chunk,file}_index,
                                                  videos/KEY/{chunk_index,file_index,from_timestamp,to_timestamp}
      data/chunk-000/file-000.parquet             one row per frame: the non-video features,
                                                  timestamp, frame_index, episode_index, index, task_index
      videos/KEY/chunk-000/file-000.mp4           each camera's frames, episodes one after another

Feature names map onto rlfleet's observation keys by a written mapping (`demos.features`, rlfleet
key -> the dataset's feature name, or a list of names concatenated in order); keys it leaves out
take the defaults below, which are also the names rlfleet writes:

    states       observation.state (+ observation.environment_state when present, as LeRobot's
                 gym envs split a Dict observation: agent_pos, environment_state)
    actions      action
    main_images  observation.images.main, else observation.image, else the first camera feature
    wrist_images observation.images.wrist (only when the policy reads it)
    rewards      next.reward (zeros when absent)
    success      next.success (absent: every episode counts as a successful demonstration)

Actions are stored in the env's own units (what LeRobot's recorders write); `to_policy_actions`
maps them to the policy's [-1, 1] with the env's action bounds (rlfleet's gym door rescales the
same way). A folder or `hf://datasets/ORG/NAME[@REVISION]` (through huggingface_hub's cache).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.data.demos import DemoEpisode
from rlfleet.envs.api import encode_instructions
from rlfleet.policies.checkpoint_io import hub_snapshot

CODEBASE_VERSION = "v3.0"
HF_DATASETS = "hf://datasets/"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
# rlfleet key -> the LeRobot feature name rlfleet writes (and reads by default)
WRITE_NAMES = {
    "states": "observation.state",
    "actions": "action",
    "main_images": "observation.images.main",
    "wrist_images": "observation.images.wrist",
    "rewards": "next.reward",
    "success": "next.success",
}
_FRAME_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def _pyarrow() -> Any:
    try:
        import pyarrow as pa  # optional: the [lerobot] extra
        import pyarrow.parquet  # noqa: F401  (the submodule is used as pa.parquet)
    except ImportError as exc:
        raise ValueError('LeRobot datasets need pyarrow: pip install "rlfleet[lerobot]"') from exc
    return pa


def is_lerobot_path(path: str | os.PathLike) -> bool:
    """A LeRobot dataset: `hf://datasets/...` or a folder with meta/info.json."""
    return str(path).startswith(HF_DATASETS) or (Path(path) / "meta" / "info.json").is_file()


def resolve_dataset(path: str | os.PathLike) -> Path:
    """A dataset folder on disk: a local path as it is, `hf://datasets/ORG/NAME[@REV]` through
    huggingface_hub's cache (HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN as for hf:// checkpoints)."""
    text = str(path)
    if not text.startswith(HF_DATASETS):
        folder = Path(text)
        if not folder.exists():
            raise FileNotFoundError(f"dataset {folder} does not exist")
        return folder
    repo, _, revision = text[len(HF_DATASETS) :].partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"{text}: a Hub dataset is hf://datasets/ORG/NAME[@REVISION]")
    return hub_snapshot(repo, revision or None, "dataset", text)


def read_info(folder: Path) -> dict[str, Any]:
    info_file = folder / "meta" / "info.json"
    if not info_file.is_file():
        raise FileNotFoundError(f"{folder} has no meta/info.json: not a LeRobot dataset")
    info = json.loads(info_file.read_text())
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3."):
        raise ValueError(
            f"{folder} is a LeRobot dataset of format {version or '?'}; rlfleet reads v3.x "
            "(convert it with LeRobot's convert_dataset_v21_to_v30 script)"
        )
    return info


def feature_mapping(info: dict[str, Any], features: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """rlfleet key -> the dataset feature names it is read from (see the module doc), checked
    against the dataset's features: a name it lacks is one ValueError naming those it has."""
    feats = info.get("features", {})
    cameras = [k for k, f in feats.items() if f.get("dtype") in ("video", "image")]
    out: dict[str, list[str]] = {}
    given = dict(features or {})
    unknown = sorted(set(given) - {*WRITE_NAMES, "wrist_images"})
    if unknown:
        raise ValueError(f"demos.features: unknown rlfleet keys {unknown}; map any of {sorted(WRITE_NAMES)}")
    for key, value in given.items():
        names = [value] if isinstance(value, str) else [str(v) for v in value]
        missing = [n for n in names if n not in feats]
        if missing:
            raise ValueError(
                f"demos.features.{key}: the dataset has no feature {', '.join(missing)}; "
                f"it has {', '.join(sorted(k for k in feats if k not in _FRAME_COLUMNS))}"
            )
        out[key] = names
    if "states" not in out:
        out["states"] = [n for n in ("observation.state", "observation.environment_state") if n in feats]
    if "actions" not in out and "action" in feats:
        out["actions"] = ["action"]
    if "main_images" not in out:
        named = [n for n in ("observation.images.main", "observation.image") if n in feats]
        first = named or [c for c in cameras if c != WRITE_NAMES["wrist_images"]][:1]
        if first:
            out["main_images"] = first[:1]
    if "wrist_images" not in out and WRITE_NAMES["wrist_images"] in feats:
        out["wrist_images"] = [WRITE_NAMES["wrist_images"]]
    for key in ("rewards", "success"):
        if key not in out and WRITE_NAMES[key] in feats:
            out[key] = [WRITE_NAMES[key]]
    for key in ("states", "actions"):
        if not out.get(key):
            raise ValueError(
                f"the dataset has no {WRITE_NAMES[key]} feature: map one with demos.features.{key}=NAME "
                f"(it has {', '.join(sorted(k for k in feats if k not in _FRAME_COLUMNS))})"
            )
    return out


def _column(table: Any, name: str) -> np.ndarray:
    """A parquet column as a [N, ...] array (lists of numbers stack into rows)."""
    col = table.column(name).combine_chunks()
    values = col.to_numpy(zero_copy_only=False)
    if values.dtype == object:  # list<float> rows
        return np.stack([np.asarray(v) for v in values]) if len(values) else np.zeros((0, 0))
    return values


def _decode_video(path: Path, size: int) -> np.ndarray:
    """All frames of an mp4 as uint8 [N, size, size, 3] (size 0: the video's own size)."""
    import imageio_ffmpeg  # a core dependency (eval videos)

    out = ["-vf", f"scale={size}:{size}:flags=area"] if size else None
    gen = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", output_params=out)
    meta = next(gen)
    w, h = (size, size) if size else meta["size"]
    frames = [np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in gen]
    return np.stack(frames) if frames else np.zeros((0, h, w, 3), np.uint8)


def read_lerobot(
    path: str | os.PathLike,
    features: dict[str, Any] | None = None,
    image_size: int = 0,
    cameras: Iterable[str] = ("main_images",),
) -> list[DemoEpisode]:
    """Every episode of a LeRobot v3 dataset as `DemoEpisode`s, in episode order; `cameras`: the
    image keys to decode (none for a state-only policy), resized to `image_size` (0: as stored)."""
    pa = _pyarrow()
    folder = resolve_dataset(path)
    info = read_info(folder)
    mapping = feature_mapping(info, features)
    fps = float(info.get("fps") or 0) or 1.0
    data_tmpl, video_tmpl = info.get("data_path", DATA_PATH), info.get("video_path") or VIDEO_PATH
    ep_files = sorted((folder / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not ep_files:
        raise FileNotFoundError(f"{folder} has no meta/episodes/chunk-*/file-*.parquet")
    episodes_meta = pa.concat_tables([pa.parquet.read_table(f) for f in ep_files]).to_pylist()
    episodes_meta.sort(key=lambda e: int(e["episode_index"]))
    tables: dict[Path, Any] = {}
    videos: dict[Path, np.ndarray] = {}
    wanted = [k for k in cameras if k in mapping]
    out = []
    for ep in episodes_meta:
        data_file = folder / data_tmpl.format(
            chunk_index=int(ep.get("data/chunk_index", 0)), file_index=int(ep.get("data/file_index", 0))
        )
        if data_file not in tables:
            tables[data_file] = pa.parquet.read_table(data_file)
        table = tables[data_file]
        rows = _column(table, "episode_index") == int(ep["episode_index"])
        idx = np.flatnonzero(rows)
        if "frame_index" in table.column_names:
            idx = idx[np.argsort(_column(table, "frame_index")[idx], kind="stable")]
        length = len(idx)

        def cat(key: str, idx: np.ndarray = idx, table: Any = table) -> np.ndarray:
            parts = [_column(table, n)[idx].reshape(len(idx), -1).astype(np.float32) for n in mapping[key]]
            return np.concatenate(parts, axis=1)

        images: dict[str, np.ndarray] = {}
        for key in wanted:
            name = mapping[key][0]
            video = folder / video_tmpl.format(
                video_key=name,
                chunk_index=int(ep.get(f"videos/{name}/chunk_index", 0)),
                file_index=int(ep.get(f"videos/{name}/file_index", 0)),
            )
            if video not in videos:
                videos[video] = _decode_video(video, image_size)
            start = int(round(float(ep.get(f"videos/{name}/from_timestamp", 0.0)) * fps))
            images[key] = videos[video][start : start + length]
            if len(images[key]) != length:
                raise ValueError(f"{video}: episode {ep['episode_index']} needs {length} frames from {start}")
        success = cat("success")[:, 0] > 0.5 if "success" in mapping else np.zeros(length, bool)
        tasks = ep.get("tasks") or [""]
        task = str(tasks[0]) if isinstance(tasks, list) else str(tasks)
        first = np.flatnonzero(success)
        out.append(
            DemoEpisode(
                id=int(ep["episode_index"]),
                task=task,
                instruction_text=task,
                seed=-1,  # not recorded by LeRobot
                # without a success feature every episode is a demonstration of the task done
                success=bool(success.any()) if "success" in mapping else True,
                success_step=int(first[0]) if len(first) else -1,
                states=cat("states"),
                actions=cat("actions"),
                rewards=cat("rewards")[:, 0] if "rewards" in mapping else np.zeros(length, np.float32),
                step_success=success,
                instruction=encode_instructions([task[:128]])[0],
                main_images=images.get("main_images"),
                wrist_images=images.get("wrist_images"),
            )
        )
    return out


# --- writing ------------------------------------------------------------------------------------


def _feature(dtype: str, shape: tuple[int, ...], names: Any = None, info: dict | None = None) -> dict[str, Any]:
    feat: dict[str, Any] = {"dtype": dtype, "shape": list(shape), "names": names}
    if info:
        feat["info"] = info
    return feat


def _encode_video(path: Path, frames: np.ndarray, fps: float) -> None:
    """H.264 at constant quality 0 in yuv444p: frames come back as written, give or take the
    colour conversion's rounding (LeRobot's decoders, PyAV and torchcodec, read it)."""
    import imageio_ffmpeg  # a core dependency (eval videos)

    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames.shape[1:3]
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (w, h),
        fps=fps,
        codec="libx264",
        pix_fmt_out="yuv444p",
        output_params=["-crf", "0", "-g", "1"],  # every frame a key frame: exact seeks per episode
        macro_block_size=1,
    )
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame))
    writer.close()


def _stats(values: np.ndarray) -> dict[str, Any]:
    v = values.reshape(len(values), -1).astype(np.float64)
    return {
        "min": v.min(0).tolist(),
        "max": v.max(0).tolist(),
        "mean": v.mean(0).tolist(),
        "std": v.std(0).tolist(),
        "count": [len(v)],
    }


def write_lerobot(
    path: str | os.PathLike, episodes: list[DemoEpisode], fps: float = 10.0, robot_type: str | None = None
) -> Path:
    """Episodes as a LeRobot v3.0 dataset folder (one data file, one mp4 per camera), written to
    PATH.tmp and renamed, so an interrupted write leaves nothing at PATH."""
    pa = _pyarrow()
    if not episodes:
        raise ValueError("no episodes to write")
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cams = [k for k in ("main_images", "wrist_images") if getattr(episodes[0], k) is not None]
    tasks = sorted({ep.task for ep in episodes})
    task_index = {t: i for i, t in enumerate(tasks)}
    lengths = [ep.length for ep in episodes]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(sum(lengths))
    S, D = episodes[0].states.shape[1], episodes[0].actions.shape[1]

    frame_cols: dict[str, Any] = {
        WRITE_NAMES["states"]: pa.array(
            list(np.concatenate([ep.states for ep in episodes]).astype(np.float32)), pa.list_(pa.float32())
        ),
        WRITE_NAMES["actions"]: pa.array(
            list(np.concatenate([ep.actions for ep in episodes]).astype(np.float32)), pa.list_(pa.float32())
        ),
        WRITE_NAMES["rewards"]: pa.array(np.concatenate([ep.rewards for ep in episodes]).astype(np.float32)),
        WRITE_NAMES["success"]: pa.array(np.concatenate([ep.step_success for ep in episodes]).astype(bool)),
        "next.done": pa.array(np.concatenate([np.arange(n) == n - 1 for n in lengths])),
        "timestamp": pa.array(np.concatenate([np.arange(n) / fps for n in lengths]).astype(np.float32)),
        "frame_index": pa.array(np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)),
        "episode_index": pa.array(np.concatenate([np.full(n, i) for i, n in enumerate(lengths)]).astype(np.int64)),
        "index": pa.array(np.arange(total, dtype=np.int64)),
        "task_index": pa.array(
            np.concatenate([np.full(n, task_index[ep.task]) for ep, n in zip(episodes, lengths)]).astype(np.int64)
        ),
    }
    data_file = tmp / DATA_PATH.format(chunk_index=0, file_index=0)
    data_file.parent.mkdir(parents=True)
    pa.parquet.write_table(pa.table(frame_cols), data_file)

    features = {
        WRITE_NAMES["states"]: _feature("float32", (S,), [f"state_{i}" for i in range(S)]),
        WRITE_NAMES["actions"]: _feature("float32", (D,), [f"action_{i}" for i in range(D)]),
        WRITE_NAMES["rewards"]: _feature("float32", (1,)),
        WRITE_NAMES["success"]: _feature("bool", (1,)),
        "next.done": _feature("bool", (1,)),
        "timestamp": _feature("float32", (1,)),
        "frame_index": _feature("int64", (1,)),
        "episode_index": _feature("int64", (1,)),
        "index": _feature("int64", (1,)),
        "task_index": _feature("int64", (1,)),
    }
    for key in cams:
        frames = np.concatenate([getattr(ep, key) for ep in episodes])
        h, w = frames.shape[1:3]
        name = WRITE_NAMES[key]
        _encode_video(tmp / VIDEO_PATH.format(video_key=name, chunk_index=0, file_index=0), frames, fps)
        features[name] = _feature(
            "video",
            (h, w, 3),
            ["height", "width", "channels"],
            {
                "video.height": h,
                "video.width": w,
                "video.codec": "h264",
                "video.pix_fmt": "yuv444p",
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": 3,
                "has_audio": False,
            },
        )

    ep_rows: list[dict[str, Any]] = []
    for i, (ep, start, n) in enumerate(zip(episodes, starts, lengths)):
        row: dict[str, Any] = {
            "episode_index": i,
            "tasks": [ep.task],
            "length": n,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": int(start),
            "dataset_to_index": int(start + n),
            "meta/episodes/chunk_index": 0,
            "meta/episodes/file_index": 0,
        }
        for key in cams:
            name = WRITE_NAMES[key]
            row[f"videos/{name}/chunk_index"] = 0
            row[f"videos/{name}/file_index"] = 0
            row[f"videos/{name}/from_timestamp"] = float(start / fps)
            row[f"videos/{name}/to_timestamp"] = float((start + n) / fps)
        ep_rows.append(row)
    ep_file = tmp / EPISODES_PATH.format(chunk_index=0, file_index=0)
    ep_file.parent.mkdir(parents=True)
    pa.parquet.write_table(pa.Table.from_pylist(ep_rows), ep_file)
    pa.parquet.write_table(
        pa.table({"task_index": pa.array(list(task_index.values()), pa.int64()), "task": tasks}),
        tmp / "meta" / "tasks.parquet",
    )
    stats = {
        WRITE_NAMES["states"]: _stats(np.concatenate([ep.states for ep in episodes])),
        WRITE_NAMES["actions"]: _stats(np.concatenate([ep.actions for ep in episodes])),
    }
    (tmp / "meta" / "stats.json").write_text(json.dumps(stats, indent=1))
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": len(episodes),
        "total_frames": total,
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": fps,
        "splits": {"train": f"0:{len(episodes)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if cams else None,
        "features": features,
    }
    (tmp / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
