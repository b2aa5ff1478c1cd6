"""PostgreSQL de-duplication store (psycopg 3) for workers on many hosts.

The claim ``INSERT ... ON CONFLICT (message_id) DO NOTHING`` comes first and the handler's own
writes follow in the same transaction, committed before basic.ack. Two workers claiming the
same message_id at the same moment (a duplicate published twice, a redelivery racing the
original) cannot both run the handler: the second INSERT waits on the first one's uncommitted
row in the primary-key index. If the first commits, the second inserts 0 rows and skips; if it
rolls back, the second claims the id and runs the handler. Different message_ids never wait
for each other: this is the reference for what may run concurrently. A worker killed
mid-transaction loses its session; PostgreSQL rolls the transaction back and releases the row.
Isolation is PostgreSQL's default, READ COMMITTED. One connection per thread.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from amqp_lab.dedup.arrays import array_literal
from amqp_lab.dedup.base import Dialect, HandlerDb, SqlStore, run_in_savepoint, schema
from amqp_lab.dedup.ddl import create_missing
from amqp_lab.dedup.keepalive import DEFAULT_KEEPALIVE, PgKeepalive
from amqp_lab.dedup.pooler import prepared_elsewhere
from amqp_lab.dedup.read_only import READ_ONLY_SQLSTATE, read_only_server, reported
from amqp_lab.dedup.timeouts import server_timeout, timed_out
from amqp_lab.errors import (
    DedupStoreError,
    StoreUnavailable,
    TransactionTimedOut,
    TransientError,
)
from amqp_lab.settings import mask_secrets, mask_url

__all__ = ["PostgresDedupStore"]

log = logging.getLogger(__name__)

_SCHEMA_LOCK = 0x616D71706C6162  # pg_advisory_xact_lock key: concurrent workers create once


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


class PostgresDedupStore(SqlStore):
    """A store in the PostgreSQL database named by ``url`` (``postgresql://user@host/db``).
    One connection per thread, reopened on the next call after it broke. ``connect_timeout``
    is in seconds; ``clock`` gives claim times in epoch seconds; ``keepalive``: how a
    connection whose network is gone is found out (:mod:`amqp_lab.dedup.keepalive`: within
    about 30 s by default; the URL's own keepalive parameters win); ``prepare``: whether psycopg
    may prepare statements on the server (after five runs of one) - give False behind a pooler
    in transaction mode without prepared-statement support (PgBouncer before 1.21), where a
    statement prepared on one server session meets another (:meth:`_note`: the store stops
    preparing at the first error it sees, but cannot see every case). Raises DedupStoreError
    (password masked) when the database cannot be reached.

    A lost connection - the server restarted, the session terminated
    (``pg_terminate_backend``), the network cut - raises StoreUnavailable from whatever call
    noticed it, the handler's own statements included: the transaction is gone, nothing of it
    was committed (or, for a COMMIT whose answer was lost, the claims tell on the retry), and
    the consumer retries the delivery with backoff. So does a server that takes no writes (a
    standby after a failover, ``default_transaction_read_only``: :mod:`amqp_lab.dedup.read_only`),
    and the connection is closed: the next one may reach the primary."""

    dialect: Dialect = "postgresql"

    def __init__(
        self,
        url: str,
        clock: Callable[[], float] = time.time,
        connect_timeout: int = 10,
        keepalive: PgKeepalive = DEFAULT_KEEPALIVE,
        prepare: bool = True,
    ) -> None:
        self._url = url
        self._clock = clock
        self._timeout = connect_timeout
        try:
            self._password = str(conninfo_to_dict(url).get("password") or "")
            self._keepalive = keepalive.params(url)
        except psycopg.Error as e:
            raise DedupStoreError(f"malformed dedup store URL {mask_url(url)!r}") from e
        self._unprepared = not prepare  # (or a pooler met) no statement prepared on the server
        self._local = threading.local()
        self._all: list[psycopg.Connection[Any]] = []
        self._all_lock = threading.Lock()

        def create(db: HandlerDb) -> None:  # no table lock when the tables exist
            create_missing(db, schema("postgresql"), _SCHEMA_LOCK)

        self._run("create the schema in", create)

    @property
    def location(self) -> str:
        """The URL with any password masked."""
        return mask_secrets(self._url, self._password)

    def _error(self, what: str, e: BaseException) -> DedupStoreError:
        """StoreUnavailable for a connection-level failure (OperationalError, or the connection
        is broken or closed, or a pooler or a read-only server met: :meth:`_outage`), else
        DedupStoreError; the password is masked."""
        outage = self._outage(e)
        detail = mask_secrets(" ".join(str(outage or e).split()), self._password)
        lost = outage is not None or isinstance(e, psycopg.OperationalError) or self._lost()
        kind = StoreUnavailable if lost else DedupStoreError
        return kind(f"cannot {what} dedup store {self.location}: {detail}")

    def _note(self, noted: list[BaseException], e: BaseException, db: Any | None = None) -> None:
        """Told of every failed statement on the connection of the transaction whose list is
        ``noted`` (the HandlerDb's ``on_error``: the handler's statements through ``db``, the
        store's, a savepoint's - from any thread; never a handler's other connections): a
        statement psycopg prepared on one server session met on another
        (:func:`~amqp_lab.dedup.pooler.prepared_elsewhere`) is a connection pooler in
        transaction mode, which hands each transaction to any of its server connections.
        It is kept in ``noted``, whatever the handler does with it (catch it, wrap it or raise
        another error): the transaction is lost to it, an outage rolled back and retried
        (:meth:`_outage`). From then on no connection of the store prepares a statement on the
        server. Reactive: a prepared statement that meets another one of the same name and
        shape on the other session runs it silently - give ``prepare=False`` behind such a
        pooler. A write refused because the session ``db`` (the transaction's connection; None:
        this thread's) is read-only - a standby, ``default_transaction_read_only``
        (:func:`read_only_server`) - is kept the same way, and the connection is closed when the
        transaction ends (a session read-only from its start refuses the store's own claim,
        which comes first); a transaction the handler made read-only itself is the handler's.
        So is the server ending the transaction for a limit of its own
        (:mod:`amqp_lab.dedup.timeouts`): the transaction fails as TransactionTimedOut."""
        if server_timeout(e) is not None:
            noted.append(e)
            return
        if read_only_server(
            e, reported(db if db is not None else getattr(self._local, "db", None))
        ):
            noted.append(e)
            return
        if not prepared_elsewhere(e):
            return
        noted.append(e)
        if not self._unprepared:
            self._unprepared = True  # each connection, at its next transaction
            log.warning(
                "dedup store %s: a prepared statement met another server session (a connection"
                " pooler in transaction mode?): statements are no longer prepared on the server",
                self.location,
            )

    def _noted(self) -> list[BaseException]:
        """The outage errors of this thread's current transaction (:meth:`_note`)."""
        noted: list[BaseException] | None = getattr(self._local, "noted", None)
        if noted is None:
            noted = self._local.noted = []
        return noted

    def _outage(self, e: BaseException | None = None) -> BaseException | None:
        """The first pooler or read-only error this thread's transaction met (:meth:`_note`),
        ``e`` included (the store's own statements on the bare connection), or None."""
        noted = self._noted()
        if e is not None:
            self._note(noted, e)
        return next((n for n in noted if server_timeout(n) is None), None)

    def _lost(self) -> bool:
        db: psycopg.Connection[Any] | None = getattr(self._local, "db", None)
        return db is not None and (db.broken or db.closed)

    def _connection(self) -> psycopg.Connection[Any]:
        db: psycopg.Connection[Any] | None = getattr(self._local, "db", None)
        if db is None or db.closed or db.broken:
            self._local.db = None
            try:
                db = psycopg.connect(
                    self._url,
                    autocommit=False,
                    connect_timeout=self._timeout,
                    application_name="amqp-lab dedup",
                    **self._keepalive,
                )
            except psycopg.Error as e:
                raise self._error("open", e) from e
            self._local.db = db
            with self._all_lock:  # without the ones closed: an outage's reconnects add up
                self._all = [c for c in self._all if not c.closed]
                self._all.append(db)
        if self._unprepared and db.prepare_threshold is not None:
            db.prepare_threshold = None
        return db

    @contextmanager
    def _transaction(self, what: str) -> Iterator[HandlerDb]:
        """One transaction on this thread's connection: commit on success; roll back and
        re-raise the caller's exception unchanged otherwise (StoreUnavailable instead when the
        connection was lost); a failed COMMIT raises DedupStoreError."""
        noted: list[BaseException] = []  # (before the connection: opening it is no pooler's)
        self._local.noted = noted
        db = self._connection()
        on_error = functools.partial(self._note, noted, db=db)  # per transaction, not per handler
        self._local.on_error = on_error
        try:
            yield HandlerDb(db, "postgresql", on_error=on_error)
            if noted:  # a handler caught it and returned
                raise TransientError(f"a statement failed and the handler returned: {noted[0]}")
        except BaseException as e:
            # On a broken connection the server rolls back when the session ends.
            with suppress(psycopg.Error):
                db.rollback()
            lost = self._lost() or (bool(noted) and isinstance(e, Exception))
            self._close_read_only(db, noted)
            if isinstance(e, TransactionTimedOut):
                raise
            # the store's session ended: what ended it may show in the error that found it (a
            # handler's other connections ending alone are the handler's own failure)
            ended = [e] if db.closed or db.broken else []
            timed_out = (
                self._timed_out(what, [*ended, *noted]) if isinstance(e, Exception) else None
            )
            if timed_out is not None:
                raise timed_out from e
            if lost and not isinstance(e, StoreUnavailable):
                # the handler's statement, or a savepoint, hit the lost connection (a pooler...)
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
            timed_out = self._timed_out(f"commit to ({what})", [e])
            if timed_out is not None:
                raise timed_out from e
            error = self._error(f"commit to ({what})", e)
            self._close_read_only(db, self._noted())
            raise error from e

    def _timed_out(self, what: str, errors: list[BaseException]) -> TransactionTimedOut | None:
        """:func:`timed_out` for a call of this store (``what``: "claim in", ...)."""
        return timed_out(f"cannot {what} dedup store {self.location}", errors)

    def _close_read_only(self, db: psycopg.Connection[Any], noted: list[BaseException]) -> None:
        """Close ``db`` when a write met its session read-only (:meth:`_note`): it would stay
        so for its life; the next call opens another, which may reach the primary."""
        if any(isinstance(n, psycopg.Error) and n.sqlstate == READ_ONLY_SQLSTATE for n in noted):
            with suppress(psycopg.Error):
                db.close()

    def process_once(self, message_id: str, work: Callable[[Any], None]) -> bool:
        """Claim ``message_id`` and run ``work(db)`` in one transaction, commit, and return
        True; return False without running ``work`` if another transaction already committed
        the claim (waiting for one still open). Rolls back and re-raises what ``work`` raised;
        raises DedupStoreError when the database fails."""
        with self._transaction("claim in") as db:
            try:
                cursor = db.execute(
                    "INSERT INTO processed(message_id, processed_at) VALUES (?, ?) "
                    "ON CONFLICT (message_id) DO NOTHING",
                    (message_id, self._clock()),
                )
            except psycopg.Error as e:
                raise self._error(f"claim {message_id!r} in", e) from e
            if cursor.rowcount == 0:
                return False
            work(db)
            _raise_if_aborted(db.connection, message_id)  # this transaction's: no reconnect
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
        :class:`~amqp_lab.dedup.base.HandlerDb` whose first use opens a SAVEPOINT (so a
        failing handler's writes roll back alone), and the claims of message_ids whose every
        copy failed are deleted before the commit. A handler that returns after one of its
        statements failed (the transaction is aborted) fails with TransientError, its writes
        rolled back. Raises DedupStoreError when the database fails or a handler ended the
        transaction (nothing is committed then)."""
        now = self._clock()
        results: list[bool | BaseException] = []
        with self._transaction("claim a batch in") as handler_db:
            db = self._connection()
            try:
                claimed = {
                    row[0]
                    for row in handler_db.execute(
                        "INSERT INTO processed(message_id, processed_at) "
                        "SELECT id, ? FROM unnest(?::text[]) AS id ORDER BY id "
                        "ON CONFLICT (message_id) DO NOTHING RETURNING message_id",
                        (now, array_literal(sorted({message_id for message_id, _ in batch}))),
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

                error = self._run_handler(db, message_id, work, check)
                succeeded[message_id] = error is None
                results.append(True if error is None else error)
            failed = [message_id for message_id, ok in succeeded.items() if not ok]
            if failed:
                try:
                    db.execute("DELETE FROM processed WHERE message_id = ANY(%s)", (failed,))
                except psycopg.Error as e:
                    raise self._error("release failed claims in", e) from e
        return results

    def _run_handler(
        self,
        db: psycopg.Connection[Any],
        message_id: str,
        work: Callable[[Any], None],
        check: Callable[[], None],
    ) -> BaseException | None:
        """Run one handler of a batch in its savepoint (:func:`run_in_savepoint`); return None
        or its error - or raise StoreUnavailable once a statement met a pooler or a read-only
        server (:meth:`_note`), whether the handler failed or caught it: the whole batch is
        rolled back and retried, and no later handler runs; TransactionTimedOut, the same way,
        once the server ended the store's session for a time limit of its own."""
        error = run_in_savepoint(db, "postgresql", work, check, self._local.on_error)
        met = list(self._noted())
        if error is not None and (db.closed or db.broken):  # the store's session, not another
            met.insert(0, error)
        timed_out = self._timed_out(f"run the handler of {message_id!r} in", met)
        if timed_out is not None:  # no later handler runs on the session the server ended
            raise timed_out from met[0]
        outage = self._outage()
        if outage is not None:
            cause = error or outage
            raise self._error(f"run the handler of {message_id!r} in", cause) from cause
        return error

    def _release_claims(self, db: psycopg.Connection[Any], message_ids: list[str]) -> None:
        """After a handler committed the batch's transaction early: delete (and commit) the
        claims it committed for deliveries whose handlers never ran or failed."""
        try:
            db.execute("DELETE FROM processed WHERE message_id = ANY(%s)", (message_ids,))
            db.commit()
        except psycopg.Error as e:
            raise self._error("release the claims of unrun handlers in", e) from e

    def close(self) -> None:
        """Close every thread's connection (an open transaction is rolled back by the server)."""
        with self._all_lock:
            connections, self._all = self._all, []
        for db in connections:
            with suppress(psycopg.Error):
                db.close()
