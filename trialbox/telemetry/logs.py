"""JSON logs that carry the current span's trace id, so a log line leads to its trace.

    setup_logging()                 # root logger → one JSON object per line on stderr
    log.info("graded %s", task_id, extra={"outcome": "passed"})
    {"ts": "2026-11-30T09:00:00.123Z", "level": "INFO", "logger": "trialbox.judge",
     "message": "graded HumanEval/0", "trace_id": "4bf9…", "span_id": "00f0…",
     "outcome": "passed"}

`RecentLogs` keeps the last lines in memory so the dashboard can show the log lines of
one trace next to its spans.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import deque
from typing import Any, TextIO

from trialbox.telemetry.tracing import current_ids

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "taskName"}


def record_dict(record: logging.LogRecord) -> dict[str, Any]:
    """The JSON object for one record: time, level, logger, message, trace ids, extras."""
    ms = int(record.created * 1000) % 1000
    out: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{ms:03d}Z",
        "level": record.levelname, "logger": record.name, "message": record.getMessage()}
    ids = getattr(record, "trace_ids", None) or current_ids()
    if ids:
        out["trace_id"], out["span_id"] = ids
    for key, value in record.__dict__.items():
        if key not in _STANDARD and key != "trace_ids" and key not in out:
            out[key] = value
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_dict(record), default=str, ensure_ascii=False)


class TraceIdFilter(logging.Filter):
    """Stamps the current span's ids on the record when it is created (handlers on
    other threads, like a queue listener, would see no current span)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "trace_ids"):
            record.trace_ids = current_ids()
        return True


class RecentLogs(logging.Handler):
    """The last `keep` records as JSON objects, for the dashboard."""

    def __init__(self, keep: int = 2000, level: int = logging.INFO):
        super().__init__(level)
        self.lines: deque[dict[str, Any]] = deque(maxlen=keep)
        self._mu = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = record_dict(record)
        except Exception:
            self.handleError(record)
            return
        with self._mu:
            self.lines.append(line)

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self._mu:
            return [line for line in self.lines if line.get("trace_id") == trace_id]


_recent: RecentLogs | None = None


def recent_logs() -> RecentLogs:
    """The process's in-memory log keeper, attached to the `trialbox` logger on first use."""
    global _recent
    if _recent is None:
        _recent = RecentLogs()
        logger = logging.getLogger("trialbox")
        logger.addHandler(_recent)
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    return _recent


def setup_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> \
        logging.Handler:
    """Send the root logger's records to `stream` (stderr) as JSON lines; returns the
    handler (remove it from the root logger to undo). Idempotent per stream."""
    stream = stream or sys.stderr
    root = logging.getLogger()
    for h in root.handlers:
        if isinstance(h, logging.StreamHandler) and isinstance(h.formatter, JsonFormatter) \
                and h.stream is stream:
            return h
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(TraceIdFilter())
    root.addHandler(handler)
    root.setLevel(level)
    return handler
