"""`--log-format json`: one JSON object per line with the fixed fields and any extras."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from rlfleet.telemetry.json_logs import JsonFormatter, make_formatter


def _record(msg: str, *args, exc_info=None, **extra) -> logging.LogRecord:
    record = logging.getLogger("rlfleet.test").makeRecord(
        "rlfleet.test", logging.WARNING, __file__, 1, msg, args, exc_info, extra=extra
    )
    return record


def test_a_record_is_one_line_of_json_with_fixed_fields_and_extras():
    line = JsonFormatter(role="learner").format(_record("rejected %d pushes", 3, segment_id=7, client="actor-1"))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "WARNING" and doc["logger"] == "rlfleet.test" and doc["role"] == "learner"
    assert doc["message"] == "rejected 3 pushes"
    assert isinstance(doc["pid"], int) and doc["time"].endswith("+00:00")
    assert doc["segment_id"] == 7 and doc["client"] == "actor-1"
    assert "args" not in doc and "msg" not in doc and "levelno" not in doc  # LogRecord internals stay out


def test_tracebacks_and_values_json_cannot_hold_are_still_one_line():
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        record = _record("failed", exc_info=sys.exc_info(), path=object())
    line = JsonFormatter().format(record)
    doc = json.loads(line)
    assert "\n" not in line and "RuntimeError: boom" in doc["exc_info"]
    assert doc["path"].startswith("<object object")


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="json"):
        make_formatter("xml")


def test_the_rlfleet_command_logs_json_when_asked(tmp_path):
    """A real `rlfleet` run: a bad recipe name makes it log one error, in JSON, with role = the subcommand."""
    env = {"PATH": "/usr/bin:/bin", "RLFLEET_LOG_FORMAT": "json"}
    proc = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "learner", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert lines, proc.stderr
    assert lines[-1]["level"] == "ERROR" and lines[-1]["role"] == "learner" and "missing.yaml" in lines[-1]["message"]
