"""The relay's SQL, per dialect (pure: strings, no I/O).

Every statement uses ``?`` placeholders (:class:`~amqp_lab.dedup.HandlerDb` rewrites them for
psycopg). ``now`` is always a parameter: the time the relay read from the database's clock at
the start of its transaction (PostgreSQL: the server's, so relays on several hosts agree) or
the host's (SQLite). Lists of ids are a ``bigint[]`` parameter on PostgreSQL and expanded
placeholders on SQLite (:func:`in_list`).

The heads query is the lease's heart: a pending row is a candidate when its time has come, it
is not leased by a live lease, and it is its key's head - no pending row of its key has a
smaller id (a failed row, a row not yet due and a leased one all hold the key). On PostgreSQL
the candidates are taken ``FOR UPDATE SKIP LOCKED``: relays racing for rows skip each other's
instead of waiting, and a head locked by one is invisible to the others until its lease is
written (https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from amqp_lab.dedup.base import Dialect

__all__ = [
    "LEASED_COLUMNS",
    "followers_sql",
    "heads_sql",
    "in_list",
    "lease_sql",
    "now_sql",
    "size_sql",
    "status_sql",
]

LEASED_COLUMNS = (
    "id, message_id, ordering_key, exchange, routing_key, properties, headers, body, "
    "traceparent, tracestate, created_at, due_at, tries"
)


def now_sql(dialect: Dialect) -> str | None:
    """The statement reading the database's clock in epoch seconds (None on SQLite: the host's
    clock is the relay's)."""
    if dialect == "postgresql":
        return "SELECT extract(epoch FROM clock_timestamp())::float8"
    return None


def size_sql(dialect: Dialect, alias: str = "") -> str:
    """Bytes of a row's body and headers (``alias``: the table's, with its dot)."""
    length = "octet_length" if dialect == "postgresql" else "length"
    return f"({length}({alias}body) + {length}({alias}headers))"


def in_list(
    dialect: Dialect, column: str, ids: Sequence[Any], negate: bool = False
) -> tuple[str, tuple[Any, ...]]:
    """``column IN ids`` (or NOT IN) as SQL and its parameters: ``= ANY(?::bigint[])`` /
    ``?::text[]`` on PostgreSQL, expanded placeholders on SQLite. An empty list is false (true
    negated)."""
    if not ids:
        return ("1 = 1" if negate else "1 = 0"), ()
    if dialect == "postgresql":
        kind = "text" if isinstance(ids[0], str) else "bigint"
        sql = f"{column} = ANY(?::{kind}[])"
        return (f"NOT ({sql})" if negate else sql), (list(ids),)
    marks = ",".join("?" * len(ids))
    return f"{column} {'NOT IN' if negate else 'IN'} ({marks})", tuple(ids)


def heads_sql(dialect: Dialect, exclude: Sequence[int]) -> tuple[str, tuple[Any, ...]]:
    """The candidates (id, key, size), oldest due first, at most ``?`` of them: parameters
    ``(now, now, *exclude, limit)``. ``exclude``: rows this relay has in flight."""
    excluded, params = in_list(dialect, "o.id", exclude, negate=True)
    lock = " FOR UPDATE OF o SKIP LOCKED" if dialect == "postgresql" else ""
    sql = (
        f"SELECT o.id, o.ordering_key, {size_sql(dialect, 'o.')}"
        " FROM amqp_lab_outbox o"
        " WHERE o.sent_at IS NULL AND o.available_at <= ?"
        " AND (o.lease_until IS NULL OR o.lease_until <= ?)"
        f" AND {excluded}"
        " AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM amqp_lab_outbox e"
        " WHERE e.ordering_key = o.ordering_key AND e.sent_at IS NULL AND e.id < o.id))"
        f" ORDER BY o.available_at, o.id LIMIT ?{lock}"
    )
    return sql, params


def followers_sql(dialect: Dialect, keys: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
    """The first ``?`` pending rows of each of ``keys`` (heads included), in (key, id) order:
    (id, key, size, available_at, lease_until). Parameters: ``(*keys, per_key)``."""
    chosen, params = in_list(dialect, "ordering_key", keys)
    sql = (
        "SELECT id, ordering_key, size, available_at, lease_until FROM ("
        f"SELECT id, ordering_key, {size_sql(dialect)} AS size, available_at, lease_until,"
        " row_number() OVER (PARTITION BY ordering_key ORDER BY id) AS n"
        f" FROM amqp_lab_outbox WHERE sent_at IS NULL AND {chosen}) f"
        " WHERE n <= ? ORDER BY ordering_key, id"
    )
    return sql, params


def lease_sql(dialect: Dialect, ids: Sequence[int]) -> tuple[str, tuple[Any, ...]]:
    """Lease ``ids`` that are still pending and not under a live lease, returning
    :data:`LEASED_COLUMNS`. Parameters: ``(owner, until, *ids, now)``."""
    chosen, params = in_list(dialect, "id", ids)
    sql = (
        "UPDATE amqp_lab_outbox SET lease_owner = ?, lease_until = ?, tries = tries + 1"
        f" WHERE {chosen} AND sent_at IS NULL AND (lease_until IS NULL OR lease_until <= ?)"
        f" RETURNING {LEASED_COLUMNS}"
    )
    return sql, params


def status_sql(dialect: Dialect) -> str:
    """One row over the pending rows (parameters ``(now, now, now, now)``): pending, due (time
    come, not refused), scheduled (due_at in the future), failed (last try refused), parked
    (refused for good), the oldest due time among rows whose time has come (None: none)."""
    later = "greatest" if dialect == "postgresql" else "max"
    due = f"{later}(created_at, coalesce(due_at, created_at))"
    return (
        "SELECT count(*),"
        " coalesce(sum(CASE WHEN last_error IS NULL AND coalesce(due_at, 0) <= ? THEN 1 ELSE 0"
        " END), 0),"
        " coalesce(sum(CASE WHEN last_error IS NULL AND due_at > ? THEN 1 ELSE 0 END), 0),"
        " coalesce(sum(CASE WHEN last_error IS NOT NULL THEN 1 ELSE 0 END), 0),"
        " coalesce(sum(CASE WHEN last_error IS NOT NULL AND available_at > 1e300 THEN 1 ELSE 0"
        " END), 0),"
        f" min(CASE WHEN {due} <= ? THEN {due} END),"
        " min(CASE WHEN available_at > ? AND available_at < 1e300 THEN available_at END)"
        " FROM amqp_lab_outbox WHERE sent_at IS NULL"
    )
