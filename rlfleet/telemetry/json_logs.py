"""Structured logs: one JSON object per line, for log shippers (Loki, Elasticsearch, Cloud Logging).

Every line has time, level, logger, pid, role and message; fields passed with
`log.info(..., extra={"segment_id": 7})` are added as they are (anything JSON cannot hold is
written with str()), and a traceback goes in `exc_info`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

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
