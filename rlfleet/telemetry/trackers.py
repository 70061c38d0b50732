"""Experiment trackers: one writer that sends every scalar, table, text and video to each backend
named in `runner.logger.logger_backends` (TensorBoard, Weights & Biases, SwanLab, trackio).

TensorBoard ships with the core install; the others are the `rlfleet[trackers]` extra and are
imported only when chosen (each import below is local for that reason). Naming one that is not
installed fails before the run starts, with the pip command that fixes it. A backend that fails
while logging is warned about once and then skipped: a tracker outage never stops training.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)

# backend name -> (module to import, what to install)
BACKENDS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", 'pip install "rlfleet[trackers]" (or: pip install wandb)'),
    "swanlab": ("swanlab", 'pip install "rlfleet[swanlab]" (or: pip install swanlab)'),
    "trackio": ("trackio", 'pip install "rlfleet[trackers]" (or: pip install trackio)'),
}


def check_backends(names: Iterable[str]) -> list[str]:
    """The backend names, checked: an unknown or not-installed one is a one-line ValueError."""
    names = list(names)
    for name in names:
        if name not in BACKENDS:
            raise ValueError(
                f"runner.logger.logger_backends: unknown backend {name!r}; choose from {', '.join(BACKENDS)}"
            )
        module, install = BACKENDS[name]
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"runner.logger.logger_backends names {name!r} but {module} is not installed: {install}")
    return names


class Backend(Protocol):
    def scalars(self, values: Mapping[str, float], step: int) -> None: ...
    def text(self, key: str, text: str, step: int) -> None: ...
    def table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None: ...
    def video(self, key: str, path: Path, step: int, fps: int) -> None: ...
    def close(self) -> None: ...


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(map(str, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


class TensorBoardBackend:
    """Event files in RUN/tensorboard. Tables are Markdown text; a video is an animated GIF image
    (what TensorBoard's image panel plays; its own video summary needs moviepy)."""

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # torch's writer: tensorboard is a core dependency

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def text(self, key: str, text: str, step: int) -> None:
        self.writer.add_text(key, text, step)

    def table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self.writer.add_text(key, _markdown_table(columns, rows), step)

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        import imageio.v3 as iio  # video logging only: its codecs, Pillow and the TensorBoard protos
        from PIL import Image  # load when a video is first written
        from tensorboard.compat.proto.summary_pb2 import Summary  # (see above)

        frames = iio.imread(path)
        if len(frames) == 0:
            return
        images = [Image.fromarray(np.asarray(f, np.uint8)) for f in frames]
        buf = io.BytesIO()
        images[0].save(
            buf, format="GIF", save_all=True, append_images=images[1:], duration=max(1, round(1000 / fps)), loop=0
        )
        h, w = frames[0].shape[:2]
        image = Summary.Image(height=h, width=w, colorspace=3, encoded_image_string=buf.getvalue())
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=key, image=image)]), step)

    def histogram(self, key: str, values: np.ndarray, step: int, bins: Any) -> None:
        self.writer.add_histogram(key, values, step, bins=bins)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbBackend:
    """A W&B run in RUN/wandb; `WANDB_MODE=offline` keeps it on disk (`wandb sync` uploads it later).
    Every value is plotted against `env_step` (the TensorBoard step), so an evaluation logged after
    training never trips W&B's rule that its own step only grows."""

    def __init__(self, run_dir: Path, project: str, name: str, config: Mapping[str, Any]):
        import wandb  # optional: the [trackers] extra

        self.wandb = wandb
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            config=dict(config),
            resume="allow",
            id=os.environ.get("WANDB_RUN_ID") or None,
        )
        self.run.define_metric("env_step")
        self.run.define_metric("*", step_metric="env_step")

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self.run.log({"env_step": step, **values})

    def text(self, key: str, text: str, step: int) -> None:
        self.run.log({"env_step": step, key: self.wandb.Html(f"<pre>{text}</pre>")})

    def table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self.run.log({"env_step": step, key: self.wandb.Table(columns=list(columns), data=[list(r) for r in rows])})

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        self.run.log({"env_step": step, key: self.wandb.Video(str(path), fps=fps, format="mp4")})

    def close(self) -> None:
        self.run.finish()


class SwanlabBackend:
    """A SwanLab experiment; `SWANLAB_MODE=offline` keeps it in RUN/swanlog (`local` too, with a
    dashboard: swanlab[dashboard]), the default mode uploads (after `swanlab login`)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: Mapping[str, Any]):
        import swanlab  # optional: the [trackers] extra

        self.swanlab = swanlab
        self.run = swanlab.init(
            project=project, experiment_name=name, config=dict(config), logdir=str(run_dir / "swanlog")
        )

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self.swanlab.log(dict(values), step=step)

    def text(self, key: str, text: str, step: int) -> None:
        self.swanlab.log({key: self.swanlab.Text(text)}, step=step)

    def table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self.text(key, _markdown_table(columns, rows), step)

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        if path.suffix == ".gif" and hasattr(self.swanlab, "Video"):
            self.swanlab.log({key: self.swanlab.Video(str(path))}, step=step)
        else:  # swanlab.Video takes GIFs only (0.10): the MP4's path instead
            self.text(key, f"video: {path}", step)

    def close(self) -> None:
        self.swanlab.finish()


class TrackioBackend:
    """A trackio run in its local database ($TRACKIO_DIR, by default under the Hugging Face
    cache); `trackio show` opens the dashboard. `TRACKIO_SPACE_ID` sends it to a Space instead."""

    def __init__(self, project: str, name: str, config: Mapping[str, Any]):
        import trackio  # optional: the [trackers] extra

        self.trackio = trackio
        self.run = trackio.init(
            project=project,
            name=name,
            config=dict(config),
            resume="allow",
            embed=False,
            auto_log_gpu=False,
            auto_log_cpu=False,
        )

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)

    def text(self, key: str, text: str, step: int) -> None:
        self.run.log({key: self.trackio.Markdown(text)}, step=step)

    def table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self.run.log({key: self.trackio.Table(columns=list(columns), data=[list(r) for r in rows])}, step=step)

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        self.run.log({key: self.trackio.Video(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """Fan-out writer: each call goes to every backend. Method names stay plain (scalars, scalar,
    text, table, video) so any part of a run can log through the same object."""

    def __init__(self, backends: Mapping[str, Backend]):
        self.backends = dict(backends)
        self._failed: set[str] = set()

    def _each(self, method: str, *args: Any) -> None:
        for name, backend in self.backends.items():
            if name in self._failed or not hasattr(backend, method):
                continue
            try:
                getattr(backend, method)(*args)
            except Exception as exc:  # a tracker outage must not stop training: warn once, then skip it
                self._failed.add(name)
                log.warning(
                    "tracker %s failed (%s: %s); it gets no more metrics in this run",
                    name,
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                )

    def scalars(self, values: Mapping[str, float | None], step: int) -> None:
        finite = {k: float(v) for k, v in values.items() if v is not None and np.isfinite(v)}
        if finite:
            self._each("scalars", finite, int(step))

    def scalar(self, key: str, value: float, step: int) -> None:
        self.scalars({key: value}, step)

    def text(self, key: str, text: str, step: int) -> None:
        self._each("text", key, text, int(step))

    def table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self._each("table", key, list(columns), [list(r) for r in rows], int(step))

    def video(self, key: str, path: str | Path, step: int, fps: int = 20) -> None:
        self._each("video", key, Path(path), int(step), int(fps))

    def histogram(self, key: str, values: np.ndarray, step: int, bins: Any = "tensorflow") -> None:
        """TensorBoard only (the other trackers get the per-bin counts as scalars)."""
        self._each("histogram", key, values, int(step), bins)

    def flush(self) -> None:
        self._each("flush")

    def close(self) -> None:
        self._each("close")
        self.backends.clear()


def make_backends(
    names: Iterable[str],
    run_dir: Path,
    project: str,
    name: str,
    config: Mapping[str, Any] | None = None,
    tensorboard_dir: Path | None = None,
) -> dict[str, Backend]:
    """The backends named (checked first: a missing one is a ValueError with the pip command)."""
    config = dict(config or {})
    out: dict[str, Backend] = {}
    for backend in check_backends(names):
        if backend == "tensorboard":
            out[backend] = TensorBoardBackend(tensorboard_dir or run_dir / "tensorboard")
        elif backend == "wandb":
            out[backend] = WandbBackend(run_dir, project, name, config)
        elif backend == "swanlab":
            out[backend] = SwanlabBackend(run_dir, project, name, config)
        elif backend == "trackio":
            out[backend] = TrackioBackend(project, name, config)
    return out


def logger_backends(logger_cfg: Any) -> list[str]:
    """`runner.logger.logger_backends`, less TensorBoard when the older `tensorboard: false` says so."""
    names = list(logger_cfg.get("logger_backends", ["tensorboard"]) or [])
    if not logger_cfg.get("tensorboard", True):
        names = [n for n in names if n != "tensorboard"]
    return names


def videos_since(folder: Path, t0: float) -> list[Path]:
    """MP4s under `folder` written at or after `t0` (time.time()), oldest first: what one
    evaluation wrote, without threading the list through the evaluation code."""
    if not folder.exists():
        return []
    found = [p for p in folder.rglob("*.mp4") if not p.name.startswith(".") and p.stat().st_mtime >= t0 - 1.0]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def log_eval(
    logger: MetricsLogger,
    success: Mapping[str, float],
    step: int,
    *,
    prefix: str = "eval",
    before: Mapping[str, float] | None = None,
    video_dir: Path | None = None,
    since: float | None = None,
    fps: int = 20,
) -> None:
    """An evaluation's success per task (`eval/success/<task>`, `eval/success_mean`), its table
    (with a before column when `before` is given) and the videos it wrote."""
    if not success:
        return
    scalars = {f"{prefix}/success/{task}": v for task, v in success.items()}
    scalars[f"{prefix}/success_mean"] = float(np.mean(list(success.values())))
    if before:
        scalars.update({f"{prefix}/success_before/{task}": v for task, v in before.items()})
        scalars[f"{prefix}/success_before_mean"] = float(np.mean(list(before.values())))
        rows = [
            [task, round(before.get(task, float("nan")), 4), round(v, 4), round(v - before.get(task, float("nan")), 4)]
            for task, v in success.items()
        ]
        logger.table(f"{prefix}/before_after", ["task", "before", "after", "delta"], rows, step)
    else:
        logger.table(
            f"{prefix}/success_table", ["task", "success"], [[t, round(v, 4)] for t, v in success.items()], step
        )
    logger.scalars(scalars, step)
    if video_dir is not None:
        for path in videos_since(video_dir, since if since is not None else 0.0):
            logger.video(f"{prefix}/video/{path.parent.name}", path, step, fps)
