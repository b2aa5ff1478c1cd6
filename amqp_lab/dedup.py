"""message_id de-duplication: the processed claim is committed before basic.ack.

The claim is ``INSERT ... ON CONFLICT DO NOTHING`` in the same transaction as the handler's own
writes (the handler receives the connection). Zero rows inserted means the message_id was already
processed: the delivery is acked without running the handler. A crash between commit and ack
causes a redelivery, which is then skipped and acked: at-least-once delivery plus idempotent
processing.

The embedded default is SQLite in WAL mode. The store also remembers ``first_seen_at`` per
message_id, because a broker redelivery (nack requeue) cannot carry new headers.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from amqp_lab.errors import DedupStoreError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS processed (
    message_id   TEXT PRIMARY KEY,
    processed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS first_seen (
    message_id    TEXT PRIMARY KEY,
    first_seen_at REAL NOT NULL
);
"""


class DedupStore(Protocol):
    """What the consumer needs from a de-duplication store."""

    def process_once(self, message_id: str, work: Callable[[Any], None]) -> bool:
        """Claim ``message_id`` and run ``work(connection)`` in one transaction, commit, and
        return True; return False without running ``work`` if it was already processed. If
        ``work`` raises, roll back (the claim is not kept) and re-raise."""
        ...

    def first_seen(self, message_id: str, now: float) -> float:
        """When ``message_id`` was first received (seconds since the epoch); records ``now``
        the first time."""
        ...

    def is_processed(self, message_id: str) -> bool: ...

    def close(self) -> None: ...


class SqliteDedupStore:
    """SQLite store (WAL mode) at ``path``; safe to share between threads of one process."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise DedupStoreError(f"cannot open dedup store {self.path}: {e}") from e
        self._lock = threading.Lock()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                try:
                    self._db.execute("COMMIT")
                except sqlite3.Error as e:
                    self._db.execute("ROLLBACK")
                    raise DedupStoreError(f"commit failed in {self.path}: {e}") from e

    def process_once(self, message_id: str, work: Callable[[Any], None]) -> bool:
        """See :class:`DedupStore`. Commits (fsync, synchronous=FULL) before returning True."""
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO processed(message_id, processed_at) VALUES (?, ?) "
                "ON CONFLICT(message_id) DO NOTHING",
                (message_id, time.time()),
            )
            if cursor.rowcount == 0:
                return False
            work(db)
        return True

    def first_seen(self, message_id: str, now: float) -> float:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO first_seen(message_id, first_seen_at) VALUES (?, ?) "
                "ON CONFLICT(message_id) DO NOTHING",
                (message_id, now),
            )
            row = db.execute(
                "SELECT first_seen_at FROM first_seen WHERE message_id = ?", (message_id,)
            ).fetchone()
        return float(row[0])

    def is_processed(self, message_id: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM processed WHERE message_id = ?", (message_id,)
            ).fetchone()
        return row is not None

    def close(self) -> None:
        self._db.close()
