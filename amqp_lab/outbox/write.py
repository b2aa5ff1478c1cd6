"""Writing to the outbox in the caller's own transaction: add, cancel, create the tables.

Each function takes the caller's connection - a psycopg 3 ``Connection``, a ``sqlite3``
``Connection`` or a handler's :class:`~amqp_lab.dedup.HandlerDb` - and runs its statements
there, without committing: the row commits with the caller's other writes, or rolls back with
them. A psycopg connection in autocommit mode commits each statement (each function is one
statement there, so a row is still whole).

Commit order (docs/outbox.md#commit-order): on PostgreSQL :func:`add` takes a
transaction-scoped advisory lock on the row's ordering key, in the same statement as the
insert, held until the transaction ends. Two transactions writing one key are serialized from
that insert to their commit, so the key's ids come in commit order; the relay publishes a key
in id order. Keys are independent. On SQLite every writing transaction holds the database's
write lock from its first write to its commit, so ids are in commit order already.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg

from amqp_lab.dedup.base import HandlerDb
from amqp_lab.dedup.ddl import create_missing
from amqp_lab.dedup.read_only import read_only_server, reported
from amqp_lab.errors import OutboxError, OutboxUnavailable
from amqp_lab.message import OutgoingMessage
from amqp_lab.outbox.row import RowValues, row_values
from amqp_lab.outbox.schema import NOTIFY_CHANNEL, SCHEMA_LOCK, schema
from amqp_lab.outbox.trace import writer_context

__all__ = ["KEY_LOCK_CLASS", "CancelResult", "add", "cancel", "create_schema", "handler_db"]

KEY_LOCK_CLASS = 0x6F627831
"""The first key of ``pg_advisory_xact_lock(int4, int4)`` for ordering keys (the second is
``hashtext(key)``): a key space of its own, apart from the one-bigint advisory locks."""

_COLUMNS = (
    "message_id, ordering_key, exchange, routing_key, properties, headers, body, "
    "traceparent, tracestate, created_at, due_at, available_at"
)

# One statement: the CTE with volatile functions is materialized, so the key's lock (and the
# NOTIFY, delivered at commit) happens before the row - and its identity - is made.
_ADD_POSTGRES = (
    "WITH gate AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now,"
    f" CASE WHEN ?::text IS NULL THEN NULL ELSE pg_advisory_xact_lock({KEY_LOCK_CLASS},"
    " hashtext(?::text))::text END AS locked,"
    f" CASE WHEN ?::boolean THEN pg_notify('{NOTIFY_CHANNEL}', '')::text END AS notified)"
    f" INSERT INTO amqp_lab_outbox ({_COLUMNS})"
    " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, gate.now, ?::float8,"
    " greatest(gate.now, coalesce(?::float8, gate.now)) FROM gate"
    " ON CONFLICT (message_id) DO NOTHING RETURNING 1"
)
"""A row back when the message was added: read with fetchone, which waits for it in a psycopg
pipeline too (its rowcount is -1 there until the pipeline syncs: ``add`` said False for a
row it had written)."""
_ADD_SQLITE = (
    f"INSERT INTO amqp_lab_outbox ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (message_id) DO NOTHING"
)
_NOW_POSTGRES = "extract(epoch FROM clock_timestamp())::float8"


class CancelResult(StrEnum):
    """What :func:`cancel` did.

    * ``cancelled`` - the row is gone and had never been leased: it will never be published;
    * ``cancelled-after-try`` - the row is gone, but a relay had leased it before (a relay that
      died mid-publish, a lost connection, a refusal): a copy may have reached the broker, and
      would then be delivered;
    * ``in-flight`` - a relay is publishing it now: not cancelled (it will be sent, or refused
      and then cancellable);
    * ``sent`` - the broker confirmed it (a row kept for the retention period);
    * ``not-found`` - no such row: never added, rolled back, or sent and deleted.
    """

    CANCELLED = "cancelled"
    CANCELLED_AFTER_TRY = "cancelled-after-try"
    IN_FLIGHT = "in-flight"
    SENT = "sent"
    NOT_FOUND = "not-found"


def handler_db(connection: Any) -> HandlerDb:
    """The caller's connection as a :class:`HandlerDb` (``?`` placeholders in every dialect):
    a HandlerDb as it is, a psycopg 3 or sqlite3 Connection wrapped. Raises TypeError for
    anything else (a cursor, another driver)."""
    if isinstance(connection, HandlerDb):
        return connection
    if isinstance(connection, psycopg.Connection):
        return HandlerDb(connection, "postgresql")
    if isinstance(connection, sqlite3.Connection):
        return HandlerDb(connection, "sqlite")
    raise TypeError(
        "the outbox writes on a psycopg 3 Connection, a sqlite3 Connection or a handler's db, "
        f"not {type(connection).__name__}"
    )


def _run(what: str, work: Callable[[], Any], db: HandlerDb) -> Any:
    """``work()`` with the driver's errors as OutboxError (OutboxUnavailable when the
    database cannot be reached, is locked past its busy timeout, or ``db``'s session takes no
    writes: a standby after a failover, :mod:`amqp_lab.dedup.read_only`)."""
    try:
        return work()
    except (psycopg.OperationalError, sqlite3.OperationalError) as e:
        text = " ".join(str(e).split())
        lost = isinstance(e, psycopg.OperationalError) or "locked" in text or "busy" in text
        if not lost and "no such table" in text:
            raise OutboxError(
                f"cannot {what}: the outbox table does not exist (create it first: "
                "amqp_lab.outbox.create_schema, or start amqp-lab-relay once)"
            ) from e
        raise (OutboxUnavailable if lost else OutboxError)(f"cannot {what}: {text}") from e
    except psycopg.errors.UndefinedTable as e:
        raise OutboxError(
            f"cannot {what}: the outbox table does not exist (create it first: "
            "amqp_lab.outbox.create_schema, or start amqp-lab-relay once)"
        ) from e
    except (psycopg.Error, sqlite3.Error) as e:
        kind = OutboxUnavailable if read_only_server(e, reported(db.connection)) else OutboxError
        raise kind(f"cannot {what}: {' '.join(str(e).split())}") from e


def add(
    connection: Any,
    message: OutgoingMessage,
    *,
    key: str | None = None,
    due_at: float | datetime | None = None,
    notify: bool = True,
    clock: Callable[[], float] = time.time,
) -> bool:
    """Add ``message`` to the outbox in ``connection``'s current transaction (not committed
    here): a relay publishes it once the transaction commits, and never if it rolls back.

    ``key`` orders it: messages with one key are published in the commit order of their
    transactions, after the key's earlier ones were confirmed (default: the message's ``key``
    header, as :func:`~amqp_lab.message.message_for` ``key=`` writes it; None: no order).
    ``due_at`` (an aware datetime or epoch seconds) holds it until then, on the database's
    clock. ``notify`` wakes PostgreSQL relays at commit (``NOTIFY``); they also poll.
    ``clock`` gives SQLite's times (epoch seconds).

    Returns True, or False when a row with this message_id is already in the outbox (kept
    as it was). Raises UnencodableMessage for a message no broker would take (the publisher's
    checks, before anything is written), ConfigurationError for a bad key or due_at,
    OutboxError / OutboxUnavailable when the statement fails (on PostgreSQL the caller's
    transaction is then aborted), TypeError for an unknown connection type."""
    db = handler_db(connection)
    values = row_values(message, key, due_at, writer_context(message))

    def insert() -> bool:
        if db.dialect == "postgresql":
            params: tuple[Any, ...] = (
                values.ordering_key,
                values.ordering_key,
                notify,
                *_columns(values),
                values.due_at,
                values.due_at,
            )
            return db.execute(_ADD_POSTGRES, params).fetchone() is not None
        now = clock()
        available = now if values.due_at is None else max(now, values.due_at)
        params = (*_columns(values), now, values.due_at, available)
        return bool(db.execute(_ADD_SQLITE, params).rowcount == 1)

    return bool(_run(f"add message_id={message.message_id!r} to the outbox", insert, db))


def _columns(values: RowValues) -> tuple[Any, ...]:
    return (
        values.message_id,
        values.ordering_key,
        values.exchange,
        values.routing_key,
        values.properties,
        values.headers,
        values.body,
        values.traceparent,
        values.tracestate,
    )


def cancel(
    connection: Any, message_id: str, *, clock: Callable[[], float] = time.time
) -> CancelResult:
    """Cancel the pending message ``message_id`` in ``connection``'s current transaction (a
    scheduled one, or any not yet sent): see :class:`CancelResult` for the outcomes. A row a
    relay is publishing is not touched (``in-flight``); on PostgreSQL a relay's lease
    statement and this one wait for each other's row lock, so exactly one of them wins.
    Raises OutboxError / OutboxUnavailable, TypeError as :func:`add`."""
    db = handler_db(connection)
    if (db.dialect == "postgresql" and "\x00" in message_id) or not encodable(message_id):
        return CancelResult.NOT_FOUND  # no row holds a NUL or a lone surrogate (add refuses both)
    now_sql = _NOW_POSTGRES if db.dialect == "postgresql" else "?"
    now_params: tuple[Any, ...] = () if db.dialect == "postgresql" else (clock(),)

    def delete() -> CancelResult:
        row = db.execute(
            "DELETE FROM amqp_lab_outbox WHERE message_id = ? AND sent_at IS NULL AND "
            f"(lease_until IS NULL OR lease_until <= {now_sql}) RETURNING tries",
            (message_id, *now_params),
        ).fetchone()
        if row is not None:
            tries = int(row[0])
            return CancelResult.CANCELLED if tries == 0 else CancelResult.CANCELLED_AFTER_TRY
        left = db.execute(
            "SELECT sent_at FROM amqp_lab_outbox WHERE message_id = ?", (message_id,)
        ).fetchone()
        if left is None:
            return CancelResult.NOT_FOUND
        return CancelResult.IN_FLIGHT if left[0] is None else CancelResult.SENT

    result: CancelResult = _run(f"cancel message_id={message_id!r}", delete, db)
    return result


def create_schema(connection: Any) -> None:
    """Create the outbox's tables and indexes if missing (:mod:`amqp_lab.outbox.schema`),
    in the caller's transaction (a psycopg connection: in a transaction of its own, or a
    savepoint of the current one). Raises OutboxError / OutboxUnavailable."""
    db = handler_db(connection)
    raw = connection if not isinstance(connection, HandlerDb) else None

    def create() -> None:
        if db.dialect == "postgresql" and isinstance(raw, psycopg.Connection):
            with raw.transaction():
                _create(db)
            return
        _create(db)

    _run("create the outbox tables", create, db)


def _create(db: HandlerDb) -> None:
    """The outbox's tables, unless they exist (:func:`~amqp_lab.dedup.ddl.create_missing`:
    no table lock then)."""
    create_missing(db, schema(db.dialect), SCHEMA_LOCK)


def encodable(text: str) -> bool:
    """Whether ``text`` can be sent to a database: UTF-8 (no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
