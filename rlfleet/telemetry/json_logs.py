"""Structured logs: one JSON object per line, for log shippers (Loki, Elasticsearch, Cloud Logging).

Every line has time, level, logger, pid, role and message; fields passed with
`log.info(..., extra={"segment_id": 7})` are added as they are (anything JSON cannot hold is
written with str()), and a traceback goes in `exc_info`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys

FORMAT_ENV = "RLFLEET_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
# attributes every LogRecord has: whatever else a record carries came from `extra=`
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON; `role` names the rlfleet role (learner, inference, actor, ...)."""

    def __init__(self, role: str = ""):
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "role": self.role,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def make_formatter(fmt: str, role: str = "") -> logging.Formatter:
    """`text` (the human default) or `json`."""
    if fmt == "json":
        return JsonFormatter(role)
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"unknown log format {fmt!r}: choose one of {', '.join(FORMATS)}")


def setup_logging(level: str = "INFO", fmt: str = "text", role: str = "") -> None:
    """Text for people, or one JSON object per line (`--log-format json`) for log shippers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(fmt, role))
    # Other libraries' INFO (PyOpenGL's "No OpenGL_accelerate module", absl, httpx, ...) stays out of
    # the console unless asked for with --log-level DEBUG: the root logger holds them at WARNING.
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    numeric = numeric if isinstance(numeric, int) else logging.INFO
    logging.basicConfig(level=numeric if numeric < logging.INFO else max(numeric, logging.WARNING), handlers=[handler])
    for name in ("rlfleet", "__main__"):  # our own loggers (`python -m rlfleet.cli` logs as __main__)
        logging.getLogger(name).setLevel(numeric)


def _log_format(text: str) -> str:
    if text not in FORMATS:  # also checks $RLFLEET_LOG_FORMAT, which `choices` would not
        raise argparse.ArgumentTypeError(f"{text!r}: choose text or json")
    return text


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise argparse.ArgumentTypeError(f"{text!r}: choose DEBUG, INFO, WARNING or ERROR")
    return level


def add_log_flags(p: argparse.ArgumentParser) -> None:
    """--log-level and --log-format (RLFLEET_LOG_LEVEL / RLFLEET_LOG_FORMAT), for `setup_logging`."""
    p.add_argument(
        "--log-level",
        type=_log_level,
        default=os.environ.get("RLFLEET_LOG_LEVEL") or "INFO",
        help="DEBUG, INFO, WARNING or ERROR (default: $RLFLEET_LOG_LEVEL or INFO); other libraries "
        "log at WARNING and above unless DEBUG",
    )
    p.add_argument(
        "--log-format",
        type=_log_format,
        default=os.environ.get(FORMAT_ENV) or "text",
        help="text (default: $RLFLEET_LOG_FORMAT or text) or json: one JSON object per line "
        "(time, level, logger, pid, role, message, extras)",
    )
