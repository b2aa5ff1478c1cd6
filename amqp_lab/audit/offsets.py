"""Where a stream reader starts, and where it resumes: ``x-stream-offset`` values, the offset
store (a small JSON file), and how a gap left by retention is found.

The store records, per (vhost, stream, reader name), the offset of the **last processed**
entry. It is written after processing, so a crash between two writes re-reads the entries
processed since the last write: reading is at-least-once (docs/audit-stream.md).

Each write replaces the whole file atomically (a temporary file in the same directory,
fsync, ``os.replace``) under an exclusive ``flock`` on a sidecar lock file, so readers with
different names can share one file and a crash never leaves it half written.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from amqp_lab.errors import ConfigurationError

__all__ = [
    "DEFAULT_OFFSET_FILE",
    "NAMED_STARTS",
    "OffsetStore",
    "ReaderKey",
    "Start",
    "parse_start",
    "removed_before",
]

Start = Literal["first", "last", "next"] | int | datetime
"""An ``x-stream-offset``: ``first`` (the oldest entry kept), ``last`` (the last chunk written,
so possibly several entries), ``next`` (only what is published after the consumer starts),
an offset, or a timestamp (from the first chunk written at or after it, to the second)."""
NAMED_STARTS = ("first", "last", "next")
DEFAULT_OFFSET_FILE = Path(".state") / "audit-offsets.json"


def parse_start(text: str) -> Start:
    """``first`` / ``last`` / ``next``, an offset (digits), or an ISO 8601 timestamp (a time
    without a zone is UTC). Raises ConfigurationError for anything else."""
    value = text.strip()
    if value in NAMED_STARTS:
        return value  # type: ignore[return-value]
    if value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigurationError(
            f"--from {text!r}: expected first, last, next, an offset or an ISO timestamp "
            "(2026-01-31T12:00:00Z)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def removed_before(expected: int, first_delivered: int) -> int:
    """How many offsets retention removed before a reader got to them (pure): the reader asked
    for ``expected`` and the broker started at ``first_delivered`` because the entries before
    it are gone. An offset count: the stream's own tracking chunks take offsets too, so it
    bounds the number of messages lost to the reader from above."""
    return max(0, first_delivered - expected)


@dataclass(frozen=True)
class ReaderKey:
    """Whose offset: a reader ``name`` on ``stream`` in ``vhost`` of ``broker`` (its identity,
    :func:`amqp_lab.state_key.broker_identity`; empty: not told, the layout of amqp-lab 0.2)."""

    vhost: str
    stream: str
    name: str
    broker: str = ""

    def path(self) -> tuple[str, ...]:
        """Where the entry sits in the file's JSON object."""
        if not self.broker:
            return ("offsets", self.vhost, self.stream, self.name)
        return ("brokers", self.broker, self.vhost, self.stream, self.name)

    def legacy(self) -> ReaderKey:
        """The same reader as amqp-lab 0.2 stored it, without the broker."""
        return ReaderKey(self.vhost, self.stream, self.name)


class OffsetStore:
    """The offsets of named readers in one JSON file: ``{"brokers": {broker: {vhost: {stream:
    {name: {"offset": N, "updated_at": ISO}}}}}}``, so two brokers with a vhost and stream of
    the same name never share an offset. Entries without a broker (``"offsets": {vhost:
    ...}}``, written by amqp-lab 0.2) are read when a broker has none of its own, and moved
    under the broker at its first :meth:`put`. Raises ConfigurationError when the file cannot
    be read or written (naming it)."""

    def __init__(self, path: Path | str = DEFAULT_OFFSET_FILE) -> None:
        self.path = Path(path)

    def get(self, key: ReaderKey) -> int | None:
        """The last processed offset stored for ``key`` (None: never stored)."""
        data = self._load()
        value = _entry(data, key.path()).get("offset")
        if value is None and key.broker:
            value = _entry(data, key.legacy().path()).get("offset")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def put(self, key: ReaderKey, offset: int) -> None:
        """Record ``offset`` as ``key``'s last processed entry (atomic replace of the file)."""
        with self._locked():
            data = self._load()
            *branch, name = key.path()
            _branch(data, branch, create=True)[name] = {
                "offset": offset,
                "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            if key.broker:
                *legacy, name = key.legacy().path()
                _branch(data, legacy).pop(name, None)
            self._write(data)

    def delete(self, key: ReaderKey) -> None:
        """Forget ``key``'s offset (a ``--reset``), with any entry without a broker."""
        with self._locked():
            data = self._load()
            for one in (key, key.legacy()):
                *branch, name = one.path()
                _branch(data, branch).pop(name, None)
            self._write(data)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"offsets": {}}
        except (OSError, ValueError) as e:
            raise ConfigurationError(f"cannot read offset file {self.path}: {e}") from e
        if not isinstance(data, dict):
            raise ConfigurationError(f"offset file {self.path} does not hold a JSON object")
        return data

    def _write(self, data: dict[str, Any]) -> None:
        try:
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            raise ConfigurationError(f"cannot write offset file {self.path}: {e}") from e

    @contextmanager
    def _locked(self) -> Any:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_name(self.path.name + ".lock"), "a")  # noqa: SIM115
        except OSError as e:
            raise ConfigurationError(f"cannot lock offset file {self.path}: {e}") from e
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            lock.close()


def _branch(data: dict[str, Any], path: list[str], create: bool = False) -> dict[str, Any]:
    """The object at ``path`` in ``data`` ({} - detached - where it is missing or not an
    object, unless ``create`` makes it)."""
    node: Any = data
    for part in path:
        child = node.get(part)
        if not isinstance(child, dict):
            if not create:
                return {}
            child = node[part] = {}
        node = child
    result: dict[str, Any] = node
    return result


def _entry(data: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    *branch, name = path
    entry = _branch(data, branch).get(name)
    return entry if isinstance(entry, dict) else {}
