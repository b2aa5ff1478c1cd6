"""One connection to an outbox database (psycopg 3 or sqlite3), its transactions and its
clock, for the relay's store (:mod:`amqp_lab.outbox.store`) and the operator's commands
(:mod:`amqp_lab.outbox.admin`). Used from one thread.

Every call runs in a transaction of its own - ``BEGIN IMMEDIATE`` on SQLite, so it waits up to
``busy_timeout`` for the write lock - and raises OutboxUnavailable when the database cannot be
reached (the connection is dropped and reopened by the next call) or OutboxError for any other
failure, with the password masked.

A relay's own connections to PostgreSQL (``relay_session``) run each statement as a
transaction of its own instead (autocommit), with
:data:`~amqp_lab.outbox.pg_session.RELAY_SETTINGS` given at connection start: no ``BEGIN``,
clock read or ``COMMIT`` round trip around a lease or a record, each of which costs the
relay's thread a wake-up and a wait for the GIL (measured: 4 round trips of about 4 ms each
under load around a 30 ms lease). Every statement of a relay is fenced by its lease and
idempotent on its own (:mod:`amqp_lab.outbox.store`), so none needs another's transaction;
the tables are still created in one. Behind a pooler that refuses startup settings
(PgBouncer), or accepts and drops them, a connection is :attr:`OutboxDb.pooled`: every call
is a transaction again, with its settings local to it (:mod:`amqp_lab.outbox.pg_session` says
why no setting is ever made for the session), and psycopg prepares no statement on the
server (a pooler in transaction mode hands the next statement to another server connection,
where it was never prepared).
"""

from __future__ import annotations

import functools
import logging
import math
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from amqp_lab.dedup import store_kind
from amqp_lab.dedup.base import Dialect, HandlerDb
from amqp_lab.dedup.keepalive import DEFAULT_KEEPALIVE, PgKeepalive
from amqp_lab.dedup.pooler import prepared_elsewhere
from amqp_lab.dedup.read_only import read_only_server, reported
from amqp_lab.errors import OutboxError, OutboxUnavailable
from amqp_lab.outbox.pg_session import (
    RELAY_SETTINGS,
    lock_timeout_value,
    refused,
    startup_options,
)
from amqp_lab.outbox.row import sqlite_text
from amqp_lab.outbox.sql import LEASE_SCANS, now_sql
from amqp_lab.outbox.write import _create
from amqp_lab.settings import mask_secrets, mask_url

__all__ = ["MAX_LOCK_TIMEOUT", "OutboxDb", "check_lock_timeout", "number"]

log = logging.getLogger(__name__)
_POOLED_SEEN: set[str] = set()  # outboxes whose relay warned of a pooler (relays reopen stores)
_POOLER = " (a connection pooler such as PgBouncer)"

T = TypeVar("T")


def number(value: Any, default: float = 0.0) -> float:
    """``value`` as a finite float, ``default`` for anything else (a hostile row's column)."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        return default
    return result if math.isfinite(result) else default


MAX_LOCK_TIMEOUT = 2_147_483.647
"""PostgreSQL's largest ``lock_timeout``: INT_MAX milliseconds, in seconds."""


def check_lock_timeout(seconds: float) -> None:
    """Raise ValueError unless ``seconds`` is a ``lock_timeout`` PostgreSQL takes: finite, above
    0, at most :data:`MAX_LOCK_TIMEOUT` (``inf`` made ``round`` raise OverflowError in the
    relay's thread; a larger one was refused by the server at every connection)."""
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_LOCK_TIMEOUT):
        raise ValueError(f"lock_timeout must be > 0 and <= {MAX_LOCK_TIMEOUT:,.3f} seconds")


class OutboxDb:
    """The connection to the outbox in the database ``url_or_path`` names
    (:func:`amqp_lab.dedup.store_kind`: a SQLite path or ``sqlite:///PATH``,
    ``postgresql://...``). ``clock``: SQLite's time (epoch seconds); ``busy_timeout`` (s): how
    long SQLite waits for the write lock; ``connect_timeout`` (s): PostgreSQL's;
    ``lock_timeout`` (s, PostgreSQL; None: the server's, by default none): how long one of
    this connection's statements waits for a lock - a table an operator's ``LOCK TABLE`` or a
    migration holds, a row another transaction holds - before it fails with
    ``lock_not_available``, raised as OutboxUnavailable (set on every connection opened,
    before the tables are created;
    https://www.postgresql.org/docs/current/runtime-config-client.html#GUC-LOCK-TIMEOUT);
    ``keepalive``: PostgreSQL, how a connection whose network is gone is found out and
    dropped (:mod:`amqp_lab.dedup.keepalive`: within about 30 s by default, as
    OutboxUnavailable; the URL's own keepalive parameters win). The tables are created when
    missing."""

    def __init__(
        self,
        url_or_path: str | Path,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 30.0,
        connect_timeout: int = 10,
        application_name: str = "amqp-lab relay",
        relay_session: bool = False,
        lock_timeout: float | None = None,
        keepalive: PgKeepalive = DEFAULT_KEEPALIVE,
    ) -> None:
        self.dialect: Dialect
        self.dialect, self.target = store_kind(url_or_path)
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._connect_timeout = connect_timeout
        if lock_timeout is not None:
            check_lock_timeout(lock_timeout)
        self._lock_timeout = lock_timeout
        self._application_name = application_name
        self._password = ""
        self._keepalive: dict[str, Any] = {}
        if self.dialect == "postgresql":
            try:
                self._password = str(conninfo_to_dict(self.target).get("password") or "")
                self._keepalive = keepalive.params(self.target)
            except psycopg.Error as e:
                raise OutboxError(f"malformed outbox URL {mask_url(self.target)!r}") from e
        elif self.target == ":memory:":
            raise OutboxError("an outbox in ':memory:' is seen by one connection only: give a file")
        self._connection: Any = None
        self._relay = relay_session and self.dialect == "postgresql"
        self.pooled = False
        """PostgreSQL: a pooler refused the startup settings; each call is a transaction with
        its settings local to it (set when a connection is refused, for the store's life)."""
        self.relay_session = False  # the tables are created in a transaction
        self._run("create the outbox tables in", _create)
        self.relay_session = self._relay and not self.pooled
        if self.relay_session:  # from now on: this connection and every one reopened

            def start(db: HandlerDb) -> None:
                if self.relay_session:  # (a pooler met on the way turned it off)
                    self._start_session(self._connection)

            self._run("set up a relay's session with", start)

    def _start_session(self, connection: Any) -> None:
        """Turn the PostgreSQL ``connection`` into a relay's session: autocommit (its settings
        came with the connection)."""
        if connection.autocommit:
            return
        connection.commit()
        connection.autocommit = True

    @property
    def location(self) -> str:
        """Where the outbox is: the SQLite path, or the URL with its password masked."""
        return mask_secrets(self.target, self._password) if self._password else self.target

    @property
    def lock_path(self) -> Path | None:
        """SQLite: the lock file whose holder is the one relay (None on PostgreSQL)."""
        return None if self.dialect == "postgresql" else Path(self.target + ".relay-lock")

    # --- connection and transactions ----------------------------------------------------------
    def _connect(self) -> Any:
        if self._connection is not None:
            broken = self.dialect == "postgresql" and (
                self._connection.closed or self._connection.broken
            )
            if not broken:
                return self._connection
            self.close()
        if self.dialect == "postgresql":
            connection = self._open_postgres()
            try:  # set up whole or closed: never left half set up for the next call
                if self.relay_session:
                    self._start_session(connection)
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        else:
            Path(self.target).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.target,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            db.text_factory = sqlite_text  # a value not UTF-8: marked, never a failed read
            db.execute("PRAGMA synchronous=FULL")
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                with suppress(sqlite3.OperationalError):  # another process is switching it
                    db.execute("PRAGMA journal_mode=WAL")
            self._connection = db
        return self._connection

    def _error(self, what: str, e: BaseException) -> OutboxError:
        text = mask_secrets(" ".join(str(e).split()), self._password) if self._password else str(e)
        lost = self._prepared_elsewhere(e) or isinstance(e, psycopg.OperationalError | OSError)
        if self.dialect == "postgresql":  # a standby, say: _run closes the session
            lost = lost or read_only_server(e, reported(self._connection))
        lost = lost or (
            isinstance(e, sqlite3.OperationalError) and ("locked" in text or "busy" in text)
        )
        if self.dialect == "postgresql" and self._connection is not None:
            lost = lost or self._connection.broken or self._connection.closed
        kind = OutboxUnavailable if lost else OutboxError
        return kind(f"cannot {what} outbox {self.location}: {' '.join(text.split())}")

    def _prepared_elsewhere(self, e: BaseException) -> bool:
        """Whether ``e`` is a statement psycopg prepared on one server session meeting another
        (``prepared statement "_pg3_N" does not exist``, or already does): a pooler the startup
        check did not see. The store turns :attr:`pooled` (nothing prepared, each call a
        transaction with its settings local to it) and the call is an outage, retried."""
        if not prepared_elsewhere(e):
            return False
        self._go_pooled("a statement prepared on one server session met another" + _POOLER)
        return True

    def _go_pooled(self, why: str) -> None:
        """Turn :attr:`pooled` on for the rest of the store's life, saying why once per
        outbox: a warning for a relay's store, else (an operator's command, a health check)
        INFO."""
        self.pooled, self.relay_session = True, False
        quiet = not self._relay or self.location in _POOLED_SEEN
        if self._relay:
            _POOLED_SEEN.add(self.location)
        (log.info if quiet else log.warning)(
            "outbox %s: %s: every call is a transaction with its settings local to it, no"
            " statement is prepared on the server, and a relay polls instead of LISTEN (NOTIFY"
            " does not pass a pooler in transaction mode)",
            self.location,
            why,
        )

    def _applied(self, connection: Any) -> bool:
        """Whether the server applied this connection's startup settings (a pooler configured
        to ignore the ``options`` parameter - PgBouncer's ``ignore_startup_parameters`` -
        accepts it and drops it): each of them has the source ``client``."""
        names = [name for name, _ in self._settings()]
        row = connection.execute(
            "SELECT count(*) FROM pg_settings WHERE source = 'client' AND name = ANY(%s)",
            (names,),
            prepare=False,
        ).fetchone()
        connection.rollback()
        return bool(row) and int(row[0]) == len(set(names))

    def _settings(self) -> list[tuple[str, str]]:
        """This connection's settings: the lock timeout, and a relay's."""
        timeout = self._lock_timeout
        settings = [] if timeout is None else [("lock_timeout", lock_timeout_value(timeout))]
        return settings + list(RELAY_SETTINGS if self._relay else ())

    def _open_postgres(self) -> Any:
        """A connection with :meth:`_settings` as startup options, checked to be applied - or,
        once a pooler refused or dropped them, without (:attr:`pooled`)."""
        options = {} if self.pooled else startup_options(self._settings(), self.target)
        connect: Any = functools.partial(
            psycopg.connect,
            self.target,
            autocommit=False,
            connect_timeout=self._connect_timeout,
            application_name=self._application_name,
            **self._keepalive,
        )
        try:
            connection = connect(**options)
        except psycopg.OperationalError as e:
            if not options or not refused(e):
                raise
            self._go_pooled("the server refused the startup parameter 'options'" + _POOLER)
            connection = connect()
        else:
            try:
                applied = not options or self._applied(connection)
            except psycopg.errors.InsufficientPrivilege:
                applied = False  # not known: the settings go per transaction, which holds anyway
                self._go_pooled(
                    "this role may not read pg_settings, where a connection's startup settings"
                    " are seen to be applied (or dropped by a pooler)"
                )
            except BaseException:
                connection.close()
                raise
            if not applied:
                connection.close()
                if not self.pooled:
                    self._go_pooled("the server ignored the startup parameter 'options'" + _POOLER)
                connection = connect()
        if self.pooled:
            connection.prepare_threshold = None
        return connection

    @contextmanager
    def _transaction(self) -> Iterator[HandlerDb]:
        db = self._connect()
        if self.dialect == "sqlite":
            db.execute("BEGIN IMMEDIATE")
        try:
            if self.pooled and self._lock_timeout is not None:  # for this transaction only
                value = lock_timeout_value(self._lock_timeout)
                db.execute("SELECT set_config('lock_timeout', %s, true)", (value,))
            yield HandlerDb(db, self.dialect)
        except BaseException:
            with suppress(Exception):
                db.rollback() if self.dialect == "postgresql" else db.execute("ROLLBACK")
            raise
        if self.dialect == "postgresql":
            db.commit()
        else:
            db.execute("COMMIT")

    def _run(self, what: str, work: Callable[[HandlerDb], T]) -> T:
        try:
            with self._transaction() as db:
                return work(db)
        except OutboxError:
            raise
        except (psycopg.Error, sqlite3.Error, OSError) as e:
            error = self._error(what, e)
            if isinstance(error, OutboxUnavailable):
                self.close()
            raise error from e

    def _now(self, db: HandlerDb, relaxed: bool = False, lease: bool = False) -> float:
        """The database's clock. ``relaxed`` (PostgreSQL): this transaction commits without
        waiting for its WAL flush (``synchronous_commit`` off, for this transaction only) -
        for the relay's leases and outcomes, where a commit lost in a server crash only
        makes rows go again (a duplicate, same message_id), never lost or reordered. An
        operator's retry or discard, and every writer's add and cancel, stay durable.
        ``lease`` (PostgreSQL): the transaction leases rows, with the scans of
        :data:`~amqp_lab.outbox.sql.LEASE_SCANS` turned off."""
        statement = now_sql(self.dialect)
        if statement is None:
            return self._clock()
        if relaxed:
            statement += ", set_config('synchronous_commit', 'off', true)"
        if lease:
            statement += LEASE_SCANS
        return float(db.execute(statement).fetchone()[0])

    def now(self) -> float:
        """The database's clock, epoch seconds."""
        return self._run("read the clock of", self._now)

    def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with suppress(Exception):
                connection.close()
