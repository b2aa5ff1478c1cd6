"""The SQLite dedup store: one file (WAL mode, ``synchronous=FULL``), shared by the threads of
a process and by processes on one host (not over a network file system).

One connection per thread. A delivery's transaction begins only when its handler first uses
``db`` (or, for a handler that writes nothing, at the claim after it), with ``BEGIN
IMMEDIATE``: a handler's slow work outside the database - an HTTP call - holds no lock, so
several threads and processes overlap it. The claim is inserted after the handler; if another
thread or process committed the same message_id meanwhile, the insert finds it, the handler's
writes are rolled back and the delivery is a duplicate. Threads of one process never run the
same message_id at once (the second waits for the first, then sees its claim); processes can,
and then only one of them commits. A transaction that waits longer than ``busy_timeout``
seconds for the lock raises StoreUnavailable (the consumer retries it).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay

from amqp_lab.dedup.base import (
    Dialect,
    HandlerDb,
    SqlStore,
    batches_of,
    claims_held,
    run_in_savepoint,
    schema,
)
from amqp_lab.errors import DedupStoreError, StoreUnavailable
from amqp_lab.retry.policy import Backoff

__all__ = ["SqliteDedupStore"]

OPEN_BACKOFF = Backoff(base=0.01, cap=0.1)
"""Between tries of creating a new store file another process is creating too."""


def _locked(e: BaseException) -> bool:
    """Whether ``e`` is SQLite's "database is locked" / "busy" (another process writes)."""
    return isinstance(e, sqlite3.OperationalError) and any(
        word in str(e) for word in ("locked", "busy")
    )


class SqliteDedupStore(SqlStore):
    """The store in the SQLite file at ``path`` (created if missing); ``clock`` gives claim
    times in epoch seconds; ``busy_timeout`` is in seconds. Raises DedupStoreError when the
    file cannot be opened."""

    dialect: Dialect = "sqlite"

    def __init__(
        self, path: Path | str, clock: Callable[[], float] = time.time, busy_timeout: float = 30
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._running: dict[str, threading.Event] = {}  # message_ids whose handler runs now
        # this process's threads take SQLite's write lock one after another through this lock:
        # a thread waiting in SQLite's busy handler sleeps 1, 2, 5 ... 100 ms between looks
        # (sqliteDefaultBusyCallback), one waiting here wakes when the writer is done
        self._write_lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._connection()
            # Two processes opening a new file at once: switching it to WAL (and creating the
            # tables) answers "database is locked" at once, without waiting the busy timeout,
            # so the setup is retried until busy_timeout has passed.
            Retrying(
                stop=stop_after_delay(busy_timeout),
                wait=OPEN_BACKOFF.tenacity(),
                retry=retry_if_exception(_locked),
                reraise=True,
            )(self._create_schema, db)
        except (OSError, sqlite3.Error) as e:
            raise self._error("cannot open dedup store", e) from e

    @staticmethod
    def _create_schema(db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")
        for statement in schema("sqlite"):
            db.execute(statement)

    @property
    def location(self) -> str:
        return str(self.path)

    def _connection(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            db.execute("PRAGMA synchronous=FULL")
            self._local.db = db
            with self._all_lock:
                self._all.append(db)
        return db

    def _error(self, what: str, e: Exception) -> DedupStoreError:
        """StoreUnavailable when the database is locked or busy past the timeout (another
        process holds the write lock): retrying can help. DedupStoreError otherwise."""
        text = f"{what} {self.path}: {e}"
        if isinstance(e, sqlite3.OperationalError) and any(
            word in str(e) for word in ("locked", "busy")
        ):
            return StoreUnavailable(text)
        return DedupStoreError(text)

    def _begin(self, db: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE, holding the process's write lock until :meth:`_end`. Raises
        StoreUnavailable when another thread of this process holds it past ``busy_timeout``
        (as SQLite's "database is locked" would): retried like an outage."""
        if not self._write_lock.acquire(timeout=self._busy_timeout):
            raise StoreUnavailable(
                f"cannot begin a transaction in {self.path}: another thread of this process "
                f"has held the write lock for {self._busy_timeout:g} s"
            )
        try:
            db.execute("BEGIN IMMEDIATE")  # another process's writer: waits up to busy_timeout
        except sqlite3.Error as e:
            self._write_lock.release()
            raise self._error("cannot begin a transaction in", e) from e
        self._local.writing = getattr(self._local, "writing", 0) + 1

    def _end(self, db: sqlite3.Connection, commit: bool) -> None:
        """COMMIT (or ROLLBACK) what :meth:`_begin` began - a transaction a handler ended
        itself included - and release the write lock."""
        try:
            self._finish(db, commit)
        finally:
            writing = getattr(self._local, "writing", 0)
            if writing:
                self._local.writing = writing - 1
                self._write_lock.release()

    def _finish(self, db: sqlite3.Connection, commit: bool) -> None:
        if not db.in_transaction:
            return
        if not commit:
            with suppress(sqlite3.Error):  # never hide the error that got us here
                db.execute("ROLLBACK")
            return
        try:
            db.execute("COMMIT")
        except sqlite3.Error as e:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise self._error("commit failed in", e) from e

    @contextmanager
    def _transaction(self, what: str) -> Iterator[HandlerDb]:
        """One BEGIN IMMEDIATE transaction on this thread's connection, committed on success,
        rolled back (and re-raised) otherwise."""
        db = self._connection()
        self._begin(db)
        try:
            yield HandlerDb(db, "sqlite", guard_transaction=True)
        except BaseException:
            self._end(db, commit=False)
            raise
        self._end(db, commit=True)

    @contextmanager
    def _alone(self, message_ids: Collection[str]) -> Iterator[None]:
        """Threads of this process run one message_id at a time: a second copy waits. The ids
        are taken all at once or not at all (one Event for them all, one lock round per try),
        so two batches never wait for each other in a cycle."""
        done = threading.Event()
        running = self._running
        while True:
            with self._all_lock:
                busy = next((running[m] for m in message_ids if m in running), None)
                if busy is None:
                    for message_id in message_ids:
                        running[message_id] = done
                    break
            busy.wait()
        try:
            yield
        finally:
            with self._all_lock:
                for message_id in message_ids:
                    del running[message_id]
            done.set()

    def process_once(self, message_id: str, work: Callable[[Any], None]) -> bool:
        """See :class:`~amqp_lab.dedup.base.DedupStore`: ``work`` runs with no transaction
        open until it first uses ``db``; the claim follows it in the same transaction,
        committed (fsync) before this returns True. Returns False, having committed nothing,
        when the message_id is already claimed (before or while ``work`` ran)."""
        with self._alone((message_id,)):
            if self.is_processed(message_id):
                return False
            db = self._connection()
            handler_db = HandlerDb(db, "sqlite", lambda: self._begin(db), guard_transaction=True)
            try:
                work(handler_db)
                if not handler_db.used:
                    self._begin(db)
                elif not db.in_transaction:
                    raise self._ended(message_id)
                claimed = self._claim(db, [message_id])
            except BaseException:
                self._end(db, commit=False)
                raise
            if not claimed:  # committed elsewhere meanwhile: the handler's writes go
                self._end(db, commit=False)
                return False
            self._end(db, commit=True)
            return True

    def process_batch(
        self, batch: list[tuple[str, Callable[[Any], None]]]
    ) -> list[bool | BaseException]:
        """:meth:`process_once` for many deliveries in ONE BEGIN IMMEDIATE transaction (one
        fsync; batches are for fast handlers: the lock is held across them). Returns, per
        delivery, True (processed), False (already processed: a duplicate, also within the
        batch) or the exception its work raised. Everything is committed before this returns.
        Raises DedupStoreError when the database fails or a handler ended the transaction
        (nothing is committed then).

        Each handler runs once; its first use of ``db`` opens a SAVEPOINT, so a failing
        handler rolls back only its own writes, and a handler that writes nothing costs no
        statement. One SELECT (per 500 ids) finds the claims already held and one multi-row
        INSERT (per 500) records the new ones: a batch of 500 handlers that write nothing is
        four statements instead of 1,500 (each costs CPU and a GIL hand-off with the consumer's
        I/O thread)."""
        with self._alone({message_id for message_id, _ in batch}):  # before BEGIN
            return self._process_batch(batch)

    def _process_batch(
        self, batch: list[tuple[str, Callable[[Any], None]]]
    ) -> list[bool | BaseException]:
        now = self._clock()
        results: list[bool | BaseException] = []
        db = self._connection()
        self._begin(db)
        try:
            held = claims_held(HandlerDb(db, "sqlite"), [message_id for message_id, _ in batch])
            claims: list[str] = []
            current = ""  # the message_id whose handler runs (one check for the batch)

            def still_open() -> None:
                if not db.in_transaction:
                    raise self._ended(current)

            for message_id, work in batch:
                if message_id in held:
                    results.append(False)
                    continue
                current = message_id
                error = run_in_savepoint(db, "sqlite", work, still_open)
                if error is None:
                    held.add(message_id)
                    claims.append(message_id)
                results.append(True if error is None else error)
            self._insert_claims(db, claims, now)
        except BaseException:
            self._end(db, commit=False)
            raise
        self._end(db, commit=True)
        return results

    def is_processed(self, message_id: str) -> bool:
        """Whether a claim for ``message_id`` is committed: an autocommit read, which takes
        no write lock. Raises DedupStoreError."""
        try:
            row = (
                self._connection()
                .execute("SELECT 1 FROM processed WHERE message_id = ?", (message_id,))
                .fetchone()
            )
        except sqlite3.Error as e:
            raise self._error("cannot read", e) from e
        return row is not None

    def _ended(self, message_id: str) -> DedupStoreError:
        return DedupStoreError(
            f"the handler of message_id={message_id!r} ended the batch's transaction in "
            f"{self.path} (COMMIT or ROLLBACK as SQL): writes may be committed without their "
            "claims"
        )

    def _claim(self, db: sqlite3.Connection, message_ids: list[str]) -> bool:
        """INSERT the claims (ON CONFLICT DO NOTHING); whether every one was new."""
        inserted = self._insert_claims(db, message_ids, self._clock(), ignore_conflicts=True)
        return inserted == len(message_ids)

    def _insert_claims(
        self,
        db: sqlite3.Connection,
        message_ids: list[str],
        now: float,
        ignore_conflicts: bool = False,
    ) -> int:
        """One multi-row INSERT per 500 claims, with bound parameters (not executemany: that
        runs one statement per row, each releasing and re-taking the GIL the consumer's I/O
        thread needs). Returns how many rows were inserted."""
        conflict = " ON CONFLICT (message_id) DO NOTHING" if ignore_conflicts else ""
        inserted = 0
        try:
            for chunk in batches_of(message_ids):
                rows = ",".join(["(?,?)"] * len(chunk))
                inserted += db.execute(
                    f"INSERT INTO processed(message_id, processed_at) VALUES {rows}{conflict}",
                    [value for message_id in chunk for value in (message_id, now)],
                ).rowcount
        except sqlite3.Error as e:
            raise self._error("claims failed in", e) from e
        return inserted

    def close(self) -> None:
        """Close every thread's connection."""
        with self._all_lock:
            connections, self._all = self._all, []
        for db in connections:
            with suppress(sqlite3.Error):
                db.close()
