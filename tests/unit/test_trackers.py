"""Experiment trackers (rlfleet.telemetry.trackers): the fan-out writer, W&B offline and trackio's
local database read back, eval logging, and a missing tracker as one line."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sqlite3
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlfleet.telemetry.trackers import MetricsLogger, check_backends, log_eval, logger_backends, videos_since


class Recorder:
    """A backend that keeps what it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def scalars(self, values, step):
        self.calls.append(("scalars", dict(values), step))

    def text(self, key, text, step):
        self.calls.append(("text", key, text, step))

    def table(self, key, columns, rows, step):
        self.calls.append(("table", key, columns, rows, step))

    def video(self, key, path, step, fps):
        self.calls.append(("video", key, path, step, fps))

    def close(self):
        self.calls.append(("close",))


class Broken(Recorder):
    def scalars(self, values, step):
        raise ConnectionError("tracker down")


def test_fan_out_drops_non_finite_and_survives_a_failing_backend(caplog):
    good, bad = Recorder(), Broken()
    logger = MetricsLogger({"good": good, "bad": bad})
    logger.scalars({"a": 1.0, "b": float("nan"), "c": None}, step=5)
    logger.scalar("a", 2.0, step=6)
    logger.close()
    assert good.calls == [("scalars", {"a": 1.0}, 5), ("scalars", {"a": 2.0}, 6), ("close",)]
    warnings = [r for r in caplog.records if "tracker bad failed" in r.getMessage()]
    assert len(warnings) == 1  # once, then the backend is skipped (its close too)
    assert bad.calls == []


def test_log_eval_success_table_before_after_and_videos(tmp_path):
    rec = Recorder()
    logger = MetricsLogger({"rec": rec})
    videos = tmp_path / "videos" / "reach-v3"
    videos.mkdir(parents=True)
    (videos / "ep0_success.mp4").write_bytes(b"\0")
    log_eval(
        logger,
        {"reach-v3": 0.8, "push-v3": 0.4},
        step=1000,
        before={"reach-v3": 0.5, "push-v3": 0.4},
        video_dir=tmp_path / "videos",
        since=0.0,
        fps=10,
    )
    kinds = {c[0] for c in rec.calls}
    assert kinds == {"scalars", "table", "video"}
    (scalars,) = [c[1] for c in rec.calls if c[0] == "scalars"]
    assert scalars["eval/success/reach-v3"] == 0.8 and scalars["eval/success_before/reach-v3"] == 0.5
    assert scalars["eval/success_mean"] == pytest.approx(0.6)
    (table,) = [c for c in rec.calls if c[0] == "table"]
    assert table[1] == "eval/before_after" and table[2] == ["task", "before", "after", "delta"]
    assert table[3][0] == ["reach-v3", 0.5, 0.8, 0.3]
    (video,) = [c for c in rec.calls if c[0] == "video"]
    assert video[1:] == ("eval/video/reach-v3", videos / "ep0_success.mp4", 1000, 10)


def test_videos_since_skips_older_files(tmp_path):
    old = tmp_path / "a" / "ep0_fail.mp4"
    old.parent.mkdir()
    old.write_bytes(b"\0")
    os.utime(old, (1000.0, 1000.0))
    new = tmp_path / "a" / "ep1_success.mp4"
    new.write_bytes(b"\0")
    assert videos_since(tmp_path, 2000.0) == [new]
    assert videos_since(tmp_path / "missing", 0.0) == []


def test_unknown_and_missing_backends_are_one_line(monkeypatch):
    with pytest.raises(ValueError, match="unknown backend 'mlflow'; choose from tensorboard, wandb, swanlab, trackio"):
        check_backends(["tensorboard", "mlflow"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else real(name, *a))
    with pytest.raises(ValueError) as exc:
        check_backends(["swanlab"])
    assert str(exc.value).count("\n") == 0 and 'pip install "rlfleet[swanlab]"' in str(exc.value)


def test_cli_names_the_extra_for_a_missing_tracker(monkeypatch, caplog):
    from rlfleet import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else real(name, *a))
    code = cli.main(["train", "node_reach2d_ppo", "runner.logger.logger_backends=[tensorboard,swanlab]"])
    assert code == 2
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "\n" not in error and "swanlab" in error and 'pip install "rlfleet[swanlab]"' in error


@pytest.mark.skipif(importlib.util.find_spec("swanlab") is not None, reason="swanlab is installed here")
def test_cli_missing_tracker_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "train", "node_reach2d_ppo", "runner.logger.logger_backends=[swanlab]"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "rlfleet[swanlab]" in lines[0], proc.stderr


def test_tensorboard_false_drops_it_from_the_backends():
    assert logger_backends({"logger_backends": ["tensorboard", "wandb"], "tensorboard": False}) == ["wandb"]
    assert logger_backends({}) == ["tensorboard"]


# --- real trackers, no network: W&B offline mode and trackio's local database --------------------


def _wandb_history(run_file: str) -> list[dict[str, str]]:
    """History rows of a .wandb file (W&B's LevelDB-style record log: 7-byte header, 32 KiB blocks
    of records with a 7-byte header each), decoded with W&B's own protobuf messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(run_file).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # full/first start a record, middle/last extend it
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): i.value_json for i in record.history.item})
    return rows


_LOG_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import numpy as np
    from rlfleet.config import load_config
    from rlfleet.eval.video import write_mp4
    from rlfleet.learner.metrics import MetricsWriter
    from rlfleet.telemetry.trackers import log_eval

    run_dir = Path(sys.argv[1])
    cfg = load_config("node_reach2d_ppo", [f"runner.logger.log_path={run_dir}", "runner.experiment_name=trk",
                                           "runner.logger.logger_backends=[tensorboard,wandb,trackio]"])
    writer = MetricsWriter.for_run(cfg, run_dir)
    writer.write({"train/actor/approx_kl": 0.01, "env/success_once": 0.25}, 100)
    writer.write({"train/actor/approx_kl": 0.02, "env/success_once": 0.5}, 200)
    video = write_mp4(run_dir / "videos" / "reach" / "ep0_success.mp4",
                      [np.full((64, 64, 3), 40 * i, np.uint8) for i in range(6)], 5)
    log_eval(writer, {"reach": 0.75}, 200, before={"reach": 0.25}, video_dir=run_dir / "videos", since=0.0, fps=5)
    writer.close()
""")


def test_wandb_offline_and_trackio_local_read_back(tmp_path):
    pytest.importorskip("wandb", reason="the [trackers] extra is not installed")
    pytest.importorskip("trackio", reason="the [trackers] extra is not installed")
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "TRACKIO_DIR": str(tmp_path / "trackio"),
        "HF_HUB_OFFLINE": "1",
        "WANDB_DIR": str(run_dir),
    }
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-c", _LOG_SCRIPT, str(run_dir)], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    # TensorBoard: the same scalars
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("env/success_once")] == [(100, 0.25), (200, 0.5)]
    assert [e.value for e in acc.Scalars("eval/success/reach")] == [0.75]

    # W&B offline: the run folder appears under RUN/wandb and holds every scalar against env_step
    (run_file,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    rows = _wandb_history(run_file)
    scalars = [{k: json.loads(v) for k, v in r.items()} for r in rows if "env/success_once" in r]
    assert [(r["env_step"], r["env/success_once"], r["train/actor/approx_kl"]) for r in scalars] == [
        (100, 0.25, 0.01),
        (200, 0.5, 0.02),
    ]
    evals = [r for r in rows if "eval/success/reach" in r]
    assert [json.loads(r["eval/success/reach"]) for r in evals] == [0.75]
    assert json.loads(evals[0]["eval/success_before/reach"]) == 0.25
    assert any(r.get("eval/before_after/_type") == '"table-file"' for r in rows)
    assert any(r.get("eval/video/reach/_type") == '"video-file"' for r in rows)
    media = Path(run_file).parent / "files" / "media"
    assert list(media.rglob("*.mp4")) and list(media.rglob("*.table.json"))

    # trackio: its local SQLite database, project rlfleet, run trk
    (db,) = glob.glob(str(tmp_path / "trackio" / "rlfleet.db"))
    with sqlite3.connect(db) as con:
        tables = [t for (t,) in con.execute("select name from sqlite_master where type='table'")]
        assert "metrics" in tables, tables
        logged = [
            (step, json.loads(m))
            for step, m in con.execute("select step, metrics from metrics where run_name='trk' order by id")
        ]
    by_step: dict[int, dict] = {}
    for step, metrics in logged:
        by_step.setdefault(step, {}).update(metrics)
    assert by_step[100]["env/success_once"] == 0.25 and by_step[200]["env/success_once"] == 0.5
    assert by_step[200]["eval/success/reach"] == 0.75
    assert by_step[200]["eval/before_after"]["_type"] == "trackio.table"
    assert by_step[200]["eval/video/reach"]["_type"].startswith("trackio.video")


_SWANLAB_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from rlfleet.telemetry.trackers import MetricsLogger, log_eval, make_backends
    run = Path(sys.argv[1])
    logger = MetricsLogger(make_backends(["swanlab"], run, "proj", "trk", {"seed": 3}))
    logger.scalars({"env/success_once": 0.25}, 100)
    log_eval(logger, {"reach": 0.75}, 200, before={"reach": 0.25})
    assert not logger._failed, logger._failed
    logger.close()
""")


def test_swanlab_offline_run_folder(tmp_path):
    """SwanLab in offline mode: the run folder appears under RUN/swanlog with the metric names in
    its record log and the before/after table as text media. swanlab >= 0.7 needs protobuf < 7, so
    this runs where swanlab is installed (e.g. a venv with protobuf 6)."""
    pytest.importorskip("swanlab", reason="swanlab is not installed")
    run = tmp_path / "run"
    env = {**os.environ, "SWANLAB_MODE": "offline"}
    proc = subprocess.run(
        [sys.executable, "-c", _SWANLAB_SCRIPT, str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = (run / "swanlog").glob("run-*/run-*.swanlab")
    data = record.read_bytes()
    for key in (b"env/success_once", b"eval/success/reach", b"eval/success_before/reach", b"proj", b"trk"):
        assert key in data, key
    texts = [p.read_text() for p in record.parent.glob("media/text/*.txt")]
    assert any("| reach | 0.25 | 0.75 | 0.5 |" in t for t in texts), texts
