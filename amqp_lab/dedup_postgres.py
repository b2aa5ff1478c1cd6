"""PostgreSQL de-duplication store (psycopg 3) for workers on many hosts.

Same design as :class:`amqp_lab.dedup.SqliteDedupStore`: the claim
``INSERT ... ON CONFLICT (message_id) DO NOTHING`` and the handler's own writes are one
transaction on the store's connection, committed before basic.ack.

Two workers claiming the same message_id at the same moment (a duplicate published twice, a
redelivery racing the original) cannot both run the handler: the second INSERT waits on the
first one's uncommitted row in the primary-key index. If the first commits, the second inserts
0 rows and skips; if it rolls back, the second claims the id and runs the handler. A worker
killed mid-transaction loses its session; PostgreSQL rolls the transaction back and releases the
row. Isolation is PostgreSQL's default, READ COMMITTED.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from amqp_lab.dedup import NOTE_REDELIVERY, Purged, StoreStats, run_in_savepoint
from amqp_lab.errors import DedupStoreError, StoreUnavailable, TransientError
from amqp_lab.settings import mask_secrets, mask_url

T = TypeVar("T")

_SCHEMA_LOCK = 0x616D71706C6162  # pg_advisory_xact_lock key: concurrent workers create once
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS processed ("
    " message_id TEXT PRIMARY KEY, processed_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS first_seen ("
    " message_id TEXT PRIMARY KEY, first_seen_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS redeliveries ("
    " message_id TEXT PRIMARY KEY, count INTEGER NOT NULL, last_at DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS processed_at_idx ON processed(processed_at)",
    "CREATE INDEX IF NOT EXISTS first_seen_at_idx ON first_seen(first_seen_at)",
    "CREATE INDEX IF NOT EXISTS redeliveries_last_at_idx ON redeliveries(last_at)",
)


def _raise_if_aborted(db: psycopg.Connection[Any], message_id: str) -> None:
    """A handler that caught its own failed statement and returned normally left the
    transaction aborted: PostgreSQL would turn the COMMIT into a ROLLBACK without an error
    (psycopg does not raise), so the message would be acked with neither its claim nor its
    writes. Raise TransientError instead, which rolls the writes back and retries the
    delivery."""
    if db.info.transaction_status == TransactionStatus.INERROR:
        raise TransientError(
            f"the handler of message_id={message_id!r} returned after a failed SQL statement "
            "(the transaction was aborted); its writes were rolled back"
        )


class PostgresDedupStore:
    """A store in the PostgreSQL database named by ``url`` (``postgresql://user@host/db``).
    One connection, shared by the threads of one process under a lock; reopened on the next
    call after it broke. ``connect_timeout`` is in seconds; ``clock`` gives claim times in epoch
    seconds. Raises DedupStoreError (password masked) when the database cannot be reached.

    A lost connection - the server restarted, the session terminated
    (``pg_terminate_backend``), the network cut - raises StoreUnavailable from whatever call
    noticed it, the handler's own statements included: the transaction is gone, nothing of it
    was committed (or, for a COMMIT whose answer was lost, the claims tell on the retry), and
    the consumer retries the delivery with backoff."""

    placeholder = "%s"

    def __init__(
        self, url: str, clock: Callable[[], float] = time.time, connect_timeout: int = 10
    ) -> None:
        self._url = url
        self._clock = clock
        self._timeout = connect_timeout
        try:
            self._password = str(conninfo_to_dict(url).get("password") or "")
        except psycopg.Error as e:
            raise DedupStoreError(f"malformed dedup store URL {mask_url(url)!r}") from e
        self._lock = threading.Lock()
        self._db: psycopg.Connection[Any] | None = None
        try:
            with self._transaction("create the schema in") as db:
                db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in _SCHEMA:
                    db.execute(statement)
        except psycopg.Error as e:
            raise self._error("create the schema in", e) from e

    @property
    def location(self) -> str:
        """The URL with any password masked."""
        return mask_secrets(self._url, self._password)

    def _error(self, what: str, e: BaseException) -> DedupStoreError:
        """StoreUnavailable for a connection-level failure (OperationalError, or the connection
        is broken or closed), else DedupStoreError; the password is masked."""
        detail = mask_secrets(" ".join(str(e).split()), self._password)
        lost = isinstance(e, psycopg.OperationalError) or self._lost()
        kind = StoreUnavailable if lost else DedupStoreError
        return kind(f"cannot {what} dedup store {self.location}: {detail}")

    def _lost(self) -> bool:
        return self._db is not None and (self._db.broken or self._db.closed)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._db is None or self._db.closed or self._db.broken:
            self._db = None
            try:
                self._db = psycopg.connect(
                    self._url,
                    autocommit=False,
                    connect_timeout=self._timeout,
                    application_name="amqp-lab dedup",
                )
            except psycopg.Error as e:
                raise self._error("open", e) from e
        return self._db

    @contextmanager
    def _transaction(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """One transaction under the lock: commit on success; roll back and re-raise the
        caller's exception unchanged otherwise; a failed COMMIT raises DedupStoreError."""
        with self._lock:
            db = self._connection()
            try:
                yield db
            except BaseException as e:
                # On a broken connection the server rolls back when the session ends.
                with suppress(psycopg.Error):
                    db.rollback()
                if self._lost() and not isinstance(e, StoreUnavailable):
                    # the handler's statement, or a savepoint, hit the lost connection
                    raise self._error(what, e) from e
                raise
            if db.info.transaction_status == TransactionStatus.INERROR:
                # COMMIT would silently become ROLLBACK: say so instead of reporting success
                with suppress(psycopg.Error):
                    db.rollback()
                raise DedupStoreError(
                    f"cannot commit to ({what}) dedup store {self.location}: a statement failed "
                    "and its error was swallowed; everything was rolled back"
                )
            try:
                db.commit()
            except psycopg.Error as e:
                raise self._error(f"commit to ({what})", e) from e

    def process_once(self, message_id: str, work: Callable[[Any], None]) -> bool:
        """Claim ``message_id`` and run ``work(connection)`` in one transaction, commit, and
        return True; return False without running ``work`` if another transaction already
        committed the claim (waiting for one still open). Rolls back and re-raises what
        ``work`` raised; raises DedupStoreError when the database fails."""
        with self._transaction("claim in") as db:
            try:
                cursor = db.execute(
                    "INSERT INTO processed(message_id, processed_at) VALUES (%s, %s) "
                    "ON CONFLICT (message_id) DO NOTHING",
                    (message_id, self._clock()),
                )
            except psycopg.Error as e:
                raise self._error(f"claim {message_id!r} in", e) from e
            if cursor.rowcount == 0:
                return False
            work(db)
            _raise_if_aborted(db, message_id)
        return True

    def process_batch(
        self, batch: list[tuple[str, Callable[[Any], None]]]
    ) -> list[bool | BaseException]:
        """:meth:`process_once` for many deliveries in ONE transaction. Returns, per delivery,
        True (processed), False (already processed: by a committed transaction, or earlier in
        this batch) or the exception its work raised. Everything is committed before this
        returns; the caller acks afterwards.

        The claims come first, in one ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` over the
        batch's message_ids in sorted order: a claim held by another open transaction makes this
        one wait (as in :meth:`process_once`), and two batches lock their rows in the same order,
        so they cannot deadlock on claims. Each handler then runs once with a
        :class:`~amqp_lab.dedup.SavepointConnection` (its first use opens a SAVEPOINT, so a
        failing handler's writes roll back alone), and the claims of message_ids whose every
        copy failed are deleted before the commit. A handler that returns after one of its
        statements failed (the transaction is aborted) fails with TransientError, its writes
        rolled back. Raises DedupStoreError when the database fails or a handler ended the
        transaction (nothing is committed then)."""
        now = self._clock()
        results: list[bool | BaseException] = []
        with self._transaction("claim a batch in") as db:
            try:
                claimed = {
                    row[0]
                    for row in db.execute(
                        "INSERT INTO processed(message_id, processed_at) "
                        "SELECT id, %s FROM unnest(%s::text[]) AS id ORDER BY id "
                        "ON CONFLICT (message_id) DO NOTHING RETURNING message_id",
                        (now, sorted({message_id for message_id, _ in batch})),
                    )
                }
            except psycopg.Error as e:
                raise self._error("claim a batch in", e) from e
            succeeded: dict[str, bool] = {}  # claimed message_id -> a copy of it succeeded
            for message_id, work in batch:
                if message_id not in claimed or succeeded.get(message_id):
                    results.append(False)
                    continue

                def check(message_id: str = message_id) -> None:
                    if db.info.transaction_status == TransactionStatus.IDLE:
                        ran = {m for m, ok in succeeded.items() if ok} | {message_id}
                        self._release_claims(db, sorted(claimed - ran))
                        raise DedupStoreError(
                            f"the handler of message_id={message_id!r} ended the batch's "
                            f"transaction in {self.location} (COMMIT or ROLLBACK as SQL); the "
                            "claims of the deliveries whose handlers had not run or had failed "
                            "were released, so they run again when redelivered"
                        )
                    _raise_if_aborted(db, message_id)

                error = run_in_savepoint(db, work, check)
                succeeded[message_id] = error is None
                results.append(True if error is None else error)
            failed = [message_id for message_id, ok in succeeded.items() if not ok]
            if failed:
                try:
                    db.execute("DELETE FROM processed WHERE message_id = ANY(%s)", (failed,))
                except psycopg.Error as e:
                    raise self._error("release failed claims in", e) from e
        return results

    def _release_claims(self, db: psycopg.Connection[Any], message_ids: list[str]) -> None:
        """After a handler committed the batch's transaction early: delete (and commit) the
        claims it committed for deliveries whose handlers never ran or failed."""
        try:
            db.execute("DELETE FROM processed WHERE message_id = ANY(%s)", (message_ids,))
            db.commit()
        except psycopg.Error as e:
            raise self._error("release the claims of unrun handlers in", e) from e

    def first_seen(self, message_id: str, now: float) -> float:
        """When ``message_id`` was first received (epoch seconds); records ``now`` the first
        time. Raises DedupStoreError."""
        try:
            with self._transaction("record first_seen in") as db:
                db.execute(
                    "INSERT INTO first_seen(message_id, first_seen_at) VALUES (%s, %s) "
                    "ON CONFLICT (message_id) DO NOTHING",
                    (message_id, now),
                )
                row = db.execute(
                    "SELECT first_seen_at FROM first_seen WHERE message_id = %s", (message_id,)
                ).fetchone()
        except psycopg.Error as e:
            raise self._error("record first_seen in", e) from e
        assert row is not None
        return float(row[0])

    def note_redelivery(self, message_id: str, now: float) -> int:
        """Count one more broker redelivery of ``message_id`` (committed before this returns);
        return the count. Raises DedupStoreError (StoreUnavailable when the database is lost)."""
        try:
            with self._transaction("count a redelivery in") as db:
                row = db.execute(NOTE_REDELIVERY.format(p="%s"), (message_id, now)).fetchone()
        except psycopg.Error as e:
            raise self._error("count a redelivery in", e) from e
        assert row is not None
        return int(row[0])

    def reset_redeliveries(self, message_id: str) -> None:
        """Forget ``message_id``'s redelivery count. Raises DedupStoreError."""
        try:
            with self._transaction("reset a redelivery count in") as db:
                db.execute("DELETE FROM redeliveries WHERE message_id = %s", (message_id,))
        except psycopg.Error as e:
            raise self._error("reset a redelivery count in", e) from e

    def is_processed(self, message_id: str) -> bool:
        """Whether a claim for ``message_id`` is committed. Raises DedupStoreError."""
        try:
            with self._transaction("read") as db:
                row = db.execute(
                    "SELECT 1 FROM processed WHERE message_id = %s", (message_id,)
                ).fetchone()
        except psycopg.Error as e:
            raise self._error("read", e) from e
        return row is not None

    def purge(self, older_than: float) -> Purged:
        """DELETE claims and first_seen entries recorded before ``older_than`` (epoch seconds),
        in one transaction. Raises DedupStoreError."""
        try:
            with self._transaction("purge") as db:
                processed = db.execute(
                    "DELETE FROM processed WHERE processed_at < %s", (older_than,)
                ).rowcount
                seen = db.execute(
                    "DELETE FROM first_seen WHERE first_seen_at < %s", (older_than,)
                ).rowcount
                db.execute("DELETE FROM redeliveries WHERE last_at < %s", (older_than,))
        except psycopg.Error as e:
            raise self._error("purge", e) from e
        return Purged(processed, seen)

    def stats(self) -> StoreStats:
        """How many claims the store holds and the oldest one's time. Raises DedupStoreError."""
        try:
            with self._transaction("read") as db:
                row = db.execute("SELECT count(*), min(processed_at) FROM processed").fetchone()
        except psycopg.Error as e:
            raise self._error("read", e) from e
        assert row is not None
        return StoreStats(int(row[0]), None if row[1] is None else float(row[1]))

    def run_in_transaction(self, work: Callable[[Any], T]) -> T:
        """Run ``work(connection)`` in one transaction and commit; rolls back and re-raises if
        it raises; raises DedupStoreError when the commit fails."""
        with self._transaction("write to") as db:
            result = work(db)
        return result

    def close(self) -> None:
        """Close the connection (an open transaction is rolled back by the server)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
