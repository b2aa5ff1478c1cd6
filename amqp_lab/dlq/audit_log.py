"""The DLQ audit log: one JSON line per message a person replayed or deleted.

``scripts/replay.py`` and the DLQ console (docs/console.md) write the same lines to the same
file (``--audit-log PATH``; by default ``.state/replay-audit.jsonl`` in the current directory,
beside the app: :func:`amqp_lab.cli.state.default_audit_log`), appended and flushed one at a
time, so the file says who did what to which message even when a run is cut short::

    {"at": "2026-12-01T09:12:00.123Z", "vhost": "/", "queue": "q:tasks:dlq",
     "message_id": "m-1", "status": "replayed", "error_type": "RuntimeError",
     "record_last_failed_at": "2026-12-01T09:10:04.456Z", "record_attempts": 2, "detail": ""}

``status``: ``replayed`` (``detail`` says when the record's ack was lost with the channel: it
stays in the DLQ and a next replay sends it again), ``failed`` (the replay was not confirmed; the
record stays), ``deleted``, or ``unconfirmed`` (a delete's ack was sent, then the channel died
before the broker was known to process it). A dry run writes nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePath
from types import TracebackType
from typing import Any, TextIO

from amqp_lab.dlq.record import utc_iso
from amqp_lab.dlq.view import DlqEntry

__all__ = ["DEFAULT_AUDIT_LOG", "AuditLog", "audit_line"]

DEFAULT_AUDIT_LOG = PurePath(".state", "replay-audit.jsonl")
"""Where the command line writes the audit log by default, relative to the current directory
(``--audit-log`` names another file)."""


def audit_line(
    entry: DlqEntry, status: str, detail: str, *, vhost: str, queue: str, at: float
) -> dict[str, Any]:
    """The audit line (before JSON encoding) for ``entry`` handled with ``status`` in
    ``queue`` of ``vhost`` at ``at`` (seconds since the epoch)."""
    return {
        "at": utc_iso(at),
        "vhost": vhost,
        "queue": queue,
        "message_id": entry.message_id,
        "status": status,
        "error_type": entry.error_type,
        "record_last_failed_at": entry.last_failed_at,
        "record_attempts": entry.attempts,
        "detail": detail,
    }


class AuditLog:
    """Appends audit lines to ``path`` (its directory is created); use it as a context manager
    or call :meth:`close`. Thread-safe: the console's request threads share one. Raises
    OSError when the file cannot be opened or written."""

    def __init__(
        self,
        path: Path,
        *,
        vhost: str,
        queue: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.vhost = vhost
        self.queue = queue
        self.clock = clock
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def write(self, entry: DlqEntry, status: str, detail: str = "") -> None:
        """Append and flush the line for ``entry`` (see :func:`audit_line`)."""
        line = audit_line(
            entry, status, detail, vhost=self.vhost, queue=self.queue, at=self.clock()
        )
        text = json.dumps(line) + "\n"
        with self._lock:
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        """Close the file (a second call does nothing)."""
        with self._lock:
            self._file.close()
