"""What both dedup stores share: the protocol, the schema and SQL, and the handler's ``db``.

The claim - a row in ``processed`` keyed by message_id - and the handler's own writes are one
transaction, committed before basic.ack: a redelivery finds the claim and is acked without
running the handler again (at-least-once delivery plus idempotent processing). The store also
remembers ``first_seen_at`` per message_id (a nack cannot add headers) and counts broker
redeliveries (committed before each handler run, so a handler that kills the process cannot
lose the count).

A handler gets a :class:`HandlerDb`, the same in every store and mode: ``execute`` and
``executemany`` with ``?`` placeholders (PostgreSQL's ``%s`` is written for it), cursors with
``fetchone`` / ``fetchall``, and ``dialect`` for the rare statement that differs. It cannot end
the store's transaction: ``commit``, ``rollback``, ``close`` raise TypeError, and a COMMIT sent
as SQL stops the worker with DedupStoreError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from amqp_lab.dedup.handler_db import Dialect, HandlerDb, qmark_to_format, run_in_savepoint
from amqp_lab.errors import DedupStoreError

__all__ = [
    "DedupStore",
    "Dialect",
    "HandlerDb",
    "ManagedDedupStore",
    "Purged",
    "Returned",
    "SqlStore",
    "StoreStats",
    "qmark_to_format",
    "run_in_savepoint",
]

T = TypeVar("T")

_TABLES = (
    "CREATE TABLE IF NOT EXISTS processed ("
    " message_id TEXT PRIMARY KEY, processed_at {real} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS first_seen ("
    " message_id TEXT PRIMARY KEY, first_seen_at {real} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS redeliveries ("
    " message_id TEXT PRIMARY KEY, count INTEGER NOT NULL, last_at {real} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS failures ("
    " message_id TEXT PRIMARY KEY, count INTEGER NOT NULL, last_at {real} NOT NULL)",
    "CREATE INDEX IF NOT EXISTS processed_at_idx ON processed(processed_at)",
    "CREATE INDEX IF NOT EXISTS first_seen_at_idx ON first_seen(first_seen_at)",
    "CREATE INDEX IF NOT EXISTS redeliveries_last_at_idx ON redeliveries(last_at)",
    "CREATE INDEX IF NOT EXISTS failures_last_at_idx ON failures(last_at)",
)


def schema(dialect: Dialect) -> tuple[str, ...]:
    """The statements creating the store's tables (idempotent)."""
    real = "REAL" if dialect == "sqlite" else "DOUBLE PRECISION"
    return tuple(statement.format(real=real) for statement in _TABLES)


@dataclass(frozen=True)
class Purged:
    """Records removed by a purge: processed claims and first_seen entries."""

    processed: int
    first_seen: int


@dataclass(frozen=True)
class Returned:
    """What the store knows of a redelivered message_id (:meth:`DedupStore.note_return`):
    ``processed`` (its claim is committed: a duplicate, nothing counted), ``redeliveries``
    (this one included: the poison count) and ``failures`` (recorded by
    :meth:`DedupStore.note_failure` before it was requeued)."""

    processed: bool
    redeliveries: int
    failures: int


@dataclass(frozen=True)
class StoreStats:
    """``processed``: claims held; ``oldest``: the oldest claim's time (epoch seconds) or None."""

    processed: int
    oldest: float | None


class DedupStore(Protocol):
    """What the consumer needs from a de-duplication store."""

    def process_once(self, message_id: str, work: Callable[[Any], None]) -> bool:
        """Run ``work(db)`` and record the claim for ``message_id`` in one transaction, commit,
        and return True; return False without committing anything if ``message_id`` was
        already processed. If ``work`` raises, roll back (no claim) and re-raise."""
        ...

    def first_seen(self, message_id: str, now: float) -> float:
        """When ``message_id`` was first received (seconds since the epoch); records ``now``
        the first time."""
        ...

    def note_redelivery(self, message_id: str, now: float) -> int:
        """Count one more broker redelivery of ``message_id`` (committed before this returns)
        and return how many there have been. ``now`` in epoch seconds."""
        ...

    def reset_redeliveries(self, message_id: str) -> None:
        """Forget ``message_id``'s redelivery count (after it was dead-lettered as poison)."""
        ...

    def note_return(self, message_id: str, now: float) -> Returned:
        """For a redelivered delivery, in one transaction: whether ``message_id`` is processed;
        if not, count one more redelivery (committed before this returns) and read the
        failures recorded for it. ``now`` in epoch seconds."""
        ...

    def note_failure(self, message_id: str, now: float, failures: int | None) -> float:
        """After a failed run, in one transaction: record ``first_seen`` (as
        :meth:`first_seen`; returned) and set ``message_id``'s failure count to ``failures``
        (about to be requeued), or forget it (None: its life ends in the DLQ or a retry
        copy)."""
        ...

    def is_processed(self, message_id: str) -> bool: ...

    def close(self) -> None: ...


class ManagedDedupStore(DedupStore, Protocol):
    """A store with batches, retention and direct access, as :func:`open_store` returns it."""

    dialect: Dialect

    def process_batch(
        self, batch: list[tuple[str, Callable[[Any], None]]]
    ) -> list[bool | BaseException]:
        """:meth:`process_once` for ``(message_id, work)`` pairs in one transaction; per pair
        True (processed), False (a duplicate) or what its work raised."""
        ...

    @property
    def location(self) -> str:
        """Where the store is, for messages (a path, or a URL with the password masked)."""
        ...

    def purge(self, older_than: float) -> Purged:
        """Delete claims, first_seen entries, redelivery and failure counts recorded before
        ``older_than`` (epoch seconds)."""
        ...

    def stats(self) -> StoreStats:
        """How many claims the store holds and when the oldest was made."""
        ...

    def run_in_transaction(self, work: Callable[[HandlerDb], T]) -> T:
        """Run ``work(db)`` in one transaction (no claim), commit, return its result."""
        ...


NOTE_REDELIVERY = (
    "INSERT INTO redeliveries(message_id, count, last_at) VALUES (?, 1, ?) "
    "ON CONFLICT(message_id) DO UPDATE SET count = redeliveries.count + 1, "
    "last_at = excluded.last_at RETURNING count"
)


class SqlStore:
    """The SQL both stores run the same way, on a :class:`HandlerDb` of one transaction:
    first_seen, the redelivery count, claims read, purge, stats. Subclasses give
    ``dialect``, ``location``, ``_transaction(what)`` (yielding a HandlerDb, committing on
    success) and ``_error(what, e)`` (their driver's error as DedupStoreError or
    StoreUnavailable)."""

    dialect: Dialect

    @property
    def location(self) -> str:
        raise NotImplementedError

    def _transaction(self, what: str) -> AbstractContextManager[HandlerDb]:
        raise NotImplementedError

    def _error(self, what: str, e: Exception) -> DedupStoreError:
        raise NotImplementedError

    def _run(self, what: str, work: Callable[[HandlerDb], T]) -> T:
        try:
            with self._transaction(what) as db:
                return work(db)
        except DedupStoreError:
            raise
        except Exception as e:  # the driver's error
            raise self._error(what, e) from e

    def first_seen(self, message_id: str, now: float) -> float:
        """When ``message_id`` was first received (epoch seconds); records ``now`` the first
        time. Raises DedupStoreError (StoreUnavailable when the store cannot be reached)."""

        return self._run(
            f"record first_seen of {message_id!r} in", lambda db: _first_seen(db, message_id, now)
        )

    def note_redelivery(self, message_id: str, now: float) -> int:
        """Count one more broker redelivery of ``message_id`` (committed before this returns);
        return the count. Raises DedupStoreError."""
        return self._run(
            f"count a redelivery of {message_id!r} in",
            lambda db: int(db.execute(NOTE_REDELIVERY, (message_id, now)).fetchone()[0]),
        )

    def reset_redeliveries(self, message_id: str) -> None:
        """Forget ``message_id``'s redelivery count. Raises DedupStoreError."""
        self._run(
            f"reset the redelivery count of {message_id!r} in",
            lambda db: db.execute("DELETE FROM redeliveries WHERE message_id = ?", (message_id,)),
        )

    def note_return(self, message_id: str, now: float) -> Returned:
        """See :class:`DedupStore`. Raises DedupStoreError."""

        def work(db: HandlerDb) -> Returned:
            if _processed(db, message_id):
                return Returned(True, 0, 0)
            count = int(db.execute(NOTE_REDELIVERY, (message_id, now)).fetchone()[0])
            row = db.execute(
                "SELECT count FROM failures WHERE message_id = ?", (message_id,)
            ).fetchone()
            return Returned(False, count, 0 if row is None else int(row[0]))

        return self._run(f"count a redelivery of {message_id!r} in", work)

    def note_failure(self, message_id: str, now: float, failures: int | None) -> float:
        """See :class:`DedupStore`. Raises DedupStoreError."""

        def work(db: HandlerDb) -> float:
            if failures is None:
                db.execute("DELETE FROM failures WHERE message_id = ?", (message_id,))
            else:
                db.execute(
                    "INSERT INTO failures(message_id, count, last_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (message_id) DO UPDATE SET count = excluded.count, "
                    "last_at = excluded.last_at",
                    (message_id, failures, now),
                )
            return _first_seen(db, message_id, now)

        return self._run(f"record a failure of {message_id!r} in", work)

    def is_processed(self, message_id: str) -> bool:
        """Whether a claim for ``message_id`` is committed. Raises DedupStoreError."""
        return self._run("read", lambda db: _processed(db, message_id))

    def purge(self, older_than: float) -> Purged:
        """DELETE claims, first_seen entries and redelivery counts recorded before
        ``older_than`` (epoch seconds), in one transaction. Raises DedupStoreError."""

        def work(db: HandlerDb) -> Purged:
            processed = db.execute(
                "DELETE FROM processed WHERE processed_at < ?", (older_than,)
            ).rowcount
            seen = db.execute(
                "DELETE FROM first_seen WHERE first_seen_at < ?", (older_than,)
            ).rowcount
            db.execute("DELETE FROM redeliveries WHERE last_at < ?", (older_than,))
            db.execute("DELETE FROM failures WHERE last_at < ?", (older_than,))
            return Purged(int(processed), int(seen))

        return self._run("purge", work)

    def stats(self) -> StoreStats:
        """How many claims the store holds and the oldest one's time. Raises DedupStoreError."""
        row = self._run(
            "read",
            lambda db: db.execute("SELECT count(*), min(processed_at) FROM processed").fetchone(),
        )
        return StoreStats(int(row[0]), None if row[1] is None else float(row[1]))

    def run_in_transaction(self, work: Callable[[HandlerDb], T]) -> T:
        """Run ``work(db)`` in one transaction and commit; rolls back and re-raises what it
        raised; raises DedupStoreError when the commit fails."""
        with self._transaction("write to") as db:
            return work(db)


def _processed(db: HandlerDb, message_id: str) -> bool:
    row = db.execute("SELECT 1 FROM processed WHERE message_id = ?", (message_id,)).fetchone()
    return row is not None


def _first_seen(db: HandlerDb, message_id: str, now: float) -> float:
    db.execute(
        "INSERT INTO first_seen(message_id, first_seen_at) VALUES (?, ?) "
        "ON CONFLICT (message_id) DO NOTHING",
        (message_id, now),
    )
    row = db.execute(
        "SELECT first_seen_at FROM first_seen WHERE message_id = ?", (message_id,)
    ).fetchone()
    return float(row[0])


def claims_held(db: HandlerDb, message_ids: list[str]) -> set[str]:
    """The ids among ``message_ids`` already claimed: one SELECT per 500 (bound parameters, so
    any string - NUL included - compares exactly)."""
    held: set[str] = set()
    for i in range(0, len(message_ids), 500):
        chunk = message_ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        rows = db.execute(f"SELECT message_id FROM processed WHERE message_id IN ({marks})", chunk)
        held.update(row[0] for row in rows)
    return held


def batches_of(items: list[T], size: int = 500) -> Iterator[list[T]]:
    """``items`` in lists of at most ``size``."""
    for i in range(0, len(items), size):
        yield items[i : i + size]
