"""Structured logs: one JSON object per line, for machines; text stays the default for people,
one line per record too (:class:`TextFormatter`).

:func:`report_event` turns a delivery report into the event a log pipeline indexes
(message_id, outcome, attempts, queue, vhost, trace id...); :class:`JsonFormatter` renders
``logging`` records the same way, so a worker started with ``--log-format json`` writes
nothing but JSON lines. Every text value passes through :func:`amqp_lab.settings.mask_url`:
a URL with a password never reaches a log.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from amqp_lab.observability.outcomes import SettledReport
from amqp_lab.oneline import one_line
from amqp_lab.settings import mask_url

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "TextFormatter",
    "json_line",
    "report_event",
    "use_json_logs",
]

LOG_FORMATS = ("text", "json")


def _iso(ts: float) -> str:
    """Epoch seconds as ISO 8601 UTC with milliseconds: ``2026-12-02T01:02:03.456Z``."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    return f"{whole}.{int(ts % 1 * 1000):03d}Z"


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, dict):
        return {str(k): _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value


def json_line(event: str, *, level: str = "info", ts: float | None = None, **fields: Any) -> str:
    """One event as a JSON line (no newline): ``ts`` (ISO 8601 UTC, default now), ``level``,
    ``event``, then ``fields`` with None values left out; text values masked, anything JSON
    cannot carry as ``repr`` text."""
    record: dict[str, Any] = {"ts": _iso(time.time() if ts is None else ts), "level": level}
    record["event"] = event
    record.update({k: _masked(v) for k, v in fields.items() if v is not None})
    return json.dumps(record, ensure_ascii=True, default=lambda v: mask_url(repr(v)))


def report_event(report: SettledReport, *, queue: str, vhost: str) -> dict[str, Any]:
    """The fields of a ``delivery`` event: message_id, outcome, attempts, redelivered, queue,
    vhost, trace_id, and when present error, error_type, classification, wait and
    handler_seconds (seconds)."""
    fields: dict[str, Any] = {
        "message_id": report.message_id,
        "outcome": report.outcome,
        "attempts": report.attempts,
        "redelivered": report.redelivered,
        "queue": queue,
        "vhost": vhost,
        "trace_id": report.trace_id,
        "error": report.error,
        "error_type": report.error_type,
        "classification": report.classification,
        "wait": report.wait,
        "handler_seconds": (
            None if report.handler_seconds is None else round(report.handler_seconds, 6)
        ),
    }
    return fields


class JsonFormatter(logging.Formatter):
    """A ``logging`` formatter writing one JSON object per record: ``ts``, ``level`` (lower
    case), ``event`` = ``log``, ``logger``, ``message`` (masked), ``exception`` when there is
    one, and the ``fields`` given; every value masked."""

    def __init__(self, **fields: Any) -> None:
        super().__init__()
        self.fields = fields

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line."""
        extra: dict[str, Any] = dict(self.fields)
        extra["logger"] = record.name
        extra["message"] = record.getMessage()
        if record.exc_info:
            extra["exception"] = self.formatException(record.exc_info)
        return json_line("log", level=record.levelname.lower(), ts=record.created, **extra)


class TextFormatter(logging.Formatter):
    """A ``logging`` formatter for text logs that keeps one line per record: the formatted
    record (message, and a traceback when there is one) with every line break and control
    character escaped by :func:`amqp_lab.oneline.one_line` - a message_id or an error a
    publisher chose cannot start a line that reads as another event."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line."""
        return one_line(super().format(record))


def use_json_logs(**fields: Any) -> None:
    """Render every handler of the root logger with :class:`JsonFormatter` (``fields``, e.g.
    queue and vhost, on every line); adds a stderr handler when there is none."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter(**fields))
