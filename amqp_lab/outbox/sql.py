"""The relay's SQL, per dialect (pure: strings, no I/O).

Every statement uses ``?`` placeholders (:class:`~amqp_lab.dedup.HandlerDb` rewrites them for
psycopg). ``now`` is a parameter - the time the relay read from the database's clock at the
start of its transaction (PostgreSQL: the server's, so relays on several hosts agree) or the
host's (SQLite) - but in the lease statements of a relay's session, which read the server's
clock themselves (:data:`STATEMENT_CLOCK`). Lists of ids are a ``bigint[]`` parameter on
PostgreSQL and expanded placeholders on SQLite (:func:`in_list`).

The heads query (:func:`heads_sql`) is the lease's heart, bound by indexes whatever the
backlog: among the oldest due rows no live lease holds (the ``(available_at, id)`` index), the
ones that are their key's smallest pending id (one ``(ordering_key, id)`` probe each) - a
refused row, a row not yet due and a leased one all hold their key. On PostgreSQL they are
locked ``FOR UPDATE SKIP LOCKED``: relays racing for rows skip each other's instead of
waiting, and the lock re-checks each row against its latest version
(https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE). Nothing can
put a smaller id in front of a head later: a key's later rows always get larger ids
(:mod:`amqp_lab.outbox.write`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from amqp_lab.dedup.arrays import array_literal
from amqp_lab.dedup.base import Dialect
from amqp_lab.outbox.row import UndecodableText

__all__ = [
    "LEASED_COLUMNS",
    "LEASE_SCANS",
    "STATEMENT_CLOCK",
    "after_sql",
    "blocked_sql",
    "bound",
    "followers_sql",
    "heads_sql",
    "in_list",
    "key_heads_sql",
    "key_order",
    "lease_heads_sql",
    "lease_sql",
    "leased_rows_sql",
    "mark",
    "not_in",
    "now_sql",
    "size_sql",
    "status_sql",
]

_BEFORE_WIDE = "id, message_id, ordering_key, exchange, routing_key, properties"
_AFTER_WIDE = "traceparent, tracestate, created_at, due_at, tries"
LEASED_COLUMNS = f"{_BEFORE_WIDE}, headers, body, {_AFTER_WIDE}"

LEASE_SCANS = (
    ", set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)"
    ", set_config('jit', 'off', true)"
)
"""Appended to :func:`now_sql` in a PostgreSQL lease's transaction (``true``: for that
transaction only): the due rows are found by reading the ``(available_at, id)`` index in order,
stopping at the batch. A backlog committed faster than autovacuum analyzes the table leaves
the planner estimating a handful of rows; it then chose a bitmap scan of every pending row and
a sort, so each lease read the whole backlog (measured, 20,000 pending rows: 33 ms a lease
against 11; 100,000: 68 against 18), and catching up took time quadratic in the backlog.
Every statement of a lease has an index to use (``unnest`` lists are function scans). ``jit``
off with them: a plan left with a disabled scan costs 10^10 and would be compiled first
(:data:`~amqp_lab.outbox.pg_session.RELAY_SETTINGS`)."""


STATEMENT_CLOCK = "extract(epoch FROM statement_timestamp())::float8"
"""PostgreSQL: the server's clock when the statement started, in epoch seconds - one value
for every use within the statement."""


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
    ``?::text[]`` on PostgreSQL (one text parameter: :func:`array_literal`), expanded
    placeholders on SQLite. An empty list is false (true negated)."""
    if not ids:
        return ("1 = 1" if negate else "1 = 0"), ()
    if dialect == "postgresql":
        kind = "text" if isinstance(ids[0], str) else "bigint"
        sql = f"{column} = ANY(?::{kind}[])"
        return (f"NOT ({sql})" if negate else sql), (array_literal(ids),)
    marks = ",".join(map(mark, ids))
    return f"{column} {'NOT IN' if negate else 'IN'} ({marks})", tuple(map(bound, ids))


def mark(value: Any) -> str:
    """SQLite: the placeholder for ``value`` - ``CAST(? AS TEXT)`` for an
    :class:`~amqp_lab.outbox.row.UndecodableText`, whose stored bytes :func:`bound` gives
    (a blob cast to text is those bytes), else ``?``."""
    return "CAST(? AS TEXT)" if isinstance(value, UndecodableText) else "?"


def key_order(key: Any) -> tuple[str, str]:
    """A sort key for keys as a SQLite outbox may hold them - text, or by hand an integer, a
    real or a blob - which Python cannot compare with each other."""
    return type(key).__name__, str(key)


def bound(value: Any) -> Any:
    """SQLite: the parameter for ``value`` (:func:`mark`). Before, a key that was not UTF-8
    was bound as its U+FFFD text, which matched nothing: a lease skipping that key's backlog
    found the same window again and again, and the relay leased in a loop, sending nothing
    else."""
    return value.raw if isinstance(value, UndecodableText) else value


def not_in(dialect: Dialect, column: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
    """``column NOT IN values`` for long lists: a hashed subplan over ``unnest(?)`` on
    PostgreSQL (``<> ALL(array)`` compares every element), an IN list on SQLite (it builds
    an index for it). True for an empty list."""
    if not values:
        return "1 = 1", ()
    if dialect == "postgresql":
        kind = "text" if isinstance(values[0], str) else "bigint"
        return f"NOT ({column} IN (SELECT unnest(?::{kind}[])))", (array_literal(values),)
    return in_list(dialect, column, values, negate=True)


def heads_sql(
    dialect: Dialect,
    exclude: Sequence[int],
    held: Sequence[str] = (),
    columns: str = "",
    now: str = "?",
    keys: Sequence[str] = (),
    reach: bool = False,
) -> tuple[str, tuple[Any, ...]]:
    """The due heads, oldest first, (id, key, size): among the oldest ``?`` due rows no live
    lease holds (the ``(available_at, id)`` index), those that are their key's smallest
    pending id (one ``(ordering_key, id)`` index probe each), at most ``?``; locked ``FOR
    UPDATE SKIP LOCKED`` on PostgreSQL. Parameters: ``(now, now, *exclude, *held, scan, now,
    limit)`` - or, with ``now`` an SQL expression of the clock (:data:`STATEMENT_CLOCK`),
    ``(*exclude, *held, scan, limit)``. The lease is checked on the locked row too:
    PostgreSQL re-checks the outer query's conditions against a row's latest version when it
    locks it, not the subquery's, so a row another relay leased after this statement's
    snapshot is skipped there (without it, two relays leased one row: the race test caught
    it). ``exclude``: rows this relay has in flight; ``held``: their keys, whose rows cannot
    be heads now (skipped before the probe, so a deep backlog behind keys in flight costs a
    scan, not a probe per row); ``columns``: what to select (default: id, key, size).

    With ``keys``, the candidates are those keys' heads instead of the window, when due
    (:func:`key_heads_sql`; parameters ``(*keys, now, now, limit)``, or ``(*keys, limit)``
    with ``now`` SQL): a key whose rows filled the window may have its head further on.
    With ``reach``, the window reads at most ``?`` due rows in all (:func:`_window`; that
    parameter right after the first ``now``, or first when ``now`` is SQL)."""
    if keys:
        candidates, params = key_heads_sql(dialect, keys, now)
    else:
        candidates, params = _window(dialect, exclude, held, now, "id", reach)
    lock = " FOR UPDATE OF o SKIP LOCKED" if dialect == "postgresql" else ""
    sql = (
        f"SELECT {columns or 'o.id, o.ordering_key, ' + size_sql(dialect, 'o.')}"
        f" FROM amqp_lab_outbox o WHERE o.id IN ({candidates})"
        f" AND o.sent_at IS NULL AND (o.lease_until IS NULL OR o.lease_until <= {now})"
        f" AND (o.ordering_key IS NULL OR o.id = {_HEAD_OF.format(row='o')})"
        f" ORDER BY o.available_at, o.id LIMIT ?{lock}"
    )
    return sql, params


_HEAD_OF = (
    "(SELECT min(e.id) FROM amqp_lab_outbox e"
    " WHERE e.ordering_key = {row}.ordering_key AND e.sent_at IS NULL)"
)


def _window(
    dialect: Dialect,
    exclude: Sequence[int],
    held: Sequence[str],
    now: str,
    columns: str,
    reach: bool = False,
) -> tuple[str, tuple[Any, ...]]:
    """The lease's window: the oldest ``?`` due rows no live lease holds, none of ``exclude``
    and of no key in ``held`` (parameters: ``now, now`` unless ``now`` is SQL, then the
    lists', then the scan's limit). Rows skipped do not count: with every key held, the
    window reads the whole backlog to find nothing (measured, 1,000 keys held: 30 ms with
    19,000 rows pending, 75-85 ms with 99,000). With ``reach``, it reads at most ``?`` due
    rows, skipped or not - that parameter after the first ``now`` (first when ``now`` is SQL)
    - for a lease taken ahead, which the relay's next lease backs up."""
    excluded, params = not_in(dialect, "id", exclude)
    unheld, keys = not_in(dialect, "ordering_key", held)
    due = f"sent_at IS NULL AND available_at <= {now}"
    source, where = "amqp_lab_outbox", f"{due} AND "
    if reach:  # the LIMIT in a subquery: the filters below cannot be pushed into its scan
        source = (
            "(SELECT id, ordering_key, available_at, lease_until FROM amqp_lab_outbox"
            f" WHERE {due} ORDER BY available_at, id LIMIT ?) r"
        )
        where = ""
    sql = (
        f"SELECT {columns} FROM {source}"
        f" WHERE {where}(lease_until IS NULL OR lease_until <= {now})"
        f" AND {excluded} AND (ordering_key IS NULL OR {unheld})"
        " ORDER BY available_at, id LIMIT ?"
    )
    return sql, params + keys


def key_heads_sql(
    dialect: Dialect, keys: Sequence[str], now: str = "?"
) -> tuple[str, tuple[Any, ...]]:
    """The ids of ``keys``' heads (their smallest pending id) that are due: one index probe
    per key. Parameters: the keys', then ``now`` unless it is SQL."""
    if dialect == "postgresql":
        sql = (
            "SELECT h.id FROM unnest(?::text[]) AS k(key) CROSS JOIN LATERAL"
            " (SELECT e.id, e.available_at FROM amqp_lab_outbox e WHERE e.ordering_key = k.key"
            f" AND e.sent_at IS NULL ORDER BY e.id LIMIT 1) h WHERE h.available_at <= {now}"
        )
        return sql, (array_literal(keys),)
    values = ", ".join(f"({mark(key)})" for key in keys)
    sql = (
        "SELECT e.id FROM amqp_lab_outbox e WHERE e.id IN (SELECT (SELECT min(f.id)"
        " FROM amqp_lab_outbox f WHERE f.ordering_key = k.column1 AND f.sent_at IS NULL)"
        f" FROM (VALUES {values}) AS k) AND e.available_at <= {now}"
    )
    return sql, tuple(map(bound, keys))


def blocked_sql(
    dialect: Dialect, exclude: Sequence[int], held: Sequence[str], now: str = "?"
) -> tuple[str, tuple[Any, ...]]:
    """The keys that hold back rows of :func:`heads_sql`'s window: its rows that are not
    their key's head - the head is refused and waiting, parked, not yet due or leased by
    another relay - by key. A lease that found too few heads skips these keys and looks
    further (:meth:`amqp_lab.outbox.store.OutboxStore.lease`): without that, more due rows
    behind one refused row than the window holds hid every other key's rows, and the whole
    outbox stalled behind one key. Only a full window can hide rows: one with fewer than
    ``scan`` rows holds every due row, so then no key is named and no row probed (three
    racing relays probed every window after each short lease, and the load pushed their
    statements past a 5 s lease: duplicates). Returns (key, whether its head can be leased
    now: due and no live lease) - only such a head is worth a try. Parameters:
    :func:`heads_sql`'s up to the scan's limit, the limit again, and ``now`` twice
    (``(now, now, *exclude, *held, scan, scan, now, now)``, or without the ``now`` s when it
    is SQL)."""
    window, params = _window(dialect, exclude, held, now, "id, ordering_key")
    sql = (
        f"WITH w AS MATERIALIZED ({window}), b AS (SELECT DISTINCT c.ordering_key AS key"
        " FROM w c WHERE (SELECT count(*) FROM w) >= ?"
        f" AND c.ordering_key IS NOT NULL AND c.id <> {_HEAD_OF.format(row='c')})"
        f" SELECT b.key, h.available_at <= {now}"
        f" AND (h.lease_until IS NULL OR h.lease_until <= {now})"
        " FROM b JOIN amqp_lab_outbox h ON h.id = (SELECT min(e.id) FROM amqp_lab_outbox e"
        " WHERE e.ordering_key = b.key AND e.sent_at IS NULL)"
    )
    return sql, params


def lease_heads_sql(
    exclude: Sequence[int],
    held: Sequence[str],
    now: str = "?",
    keys: Sequence[str] = (),
    reach: bool = False,
) -> tuple[str, tuple[Any, ...]]:
    """PostgreSQL: lease the due heads in one pass - :func:`heads_sql`'s rows, locked ``FOR
    UPDATE SKIP LOCKED`` and updated by the same statement (one write per row, not a lock
    and then a write) - returning :data:`LEASED_COLUMNS`, size and available_at, so no second
    statement reads the rows (2 of a 500-row lease's 20 ms). The batch is cut to its byte
    budget only afterwards, so headers and body come back only for a row of at most
    ``share`` bytes (the budget over the row limit: a batch of such rows keeps within it),
    NULL for a larger one, which :func:`leased_rows_sql` reads if the batch keeps it.
    The heads are a ``MATERIALIZED`` CTE: found and locked exactly once. As ``WHERE id IN
    (subquery)`` the planner, misled by a table not yet analyzed, ran the locking subquery
    once per pending row (a nested loop: 255 runs, 65,025 head probes, 1.3 s for a lease of
    nothing, seen under three racing relays; their leases outlived their 5 s and rows went
    twice), and a ``LIMIT ... FOR UPDATE`` subquery run again may lock and return other rows
    each time.

    Parameters: ``(now, now, *exclude, *held, scan, now, limit, owner, until, now, share,
    share)``: the lease re-checked on each row's latest version (a lease committed by another
    relay since this statement's snapshot is seen there, not in the subquery). With ``now``
    an SQL expression of the clock (:data:`STATEMENT_CLOCK`): ``(*exclude, *held, scan,
    limit, owner, lease_seconds, share, share)``, and each row returns that clock last (the
    lease needs no statement before it to read the clock). With ``keys``: those keys' due
    heads (:func:`heads_sql`), whose parameters replace the window's (``(keys, now, now,
    limit, ...)``). With ``reach``: the window's bound on the rows it reads, a parameter
    (:func:`heads_sql`)."""
    heads, params = heads_sql(
        "postgresql", exclude, held, columns="o.id AS head_id", now=now, keys=keys, reach=reach
    )
    size = size_sql("postgresql")
    wide = f"CASE WHEN {size} <= ? THEN headers END, CASE WHEN {size} <= ? THEN body END"
    until, clock = ("?", "") if now == "?" else (f"{now} + ?", f", {now}")
    sql = (
        f"WITH heads AS MATERIALIZED ({heads})"
        f" UPDATE amqp_lab_outbox SET lease_owner = ?, lease_until = {until}, tries = tries + 1"
        " FROM heads WHERE id = heads.head_id AND sent_at IS NULL"
        f" AND (lease_until IS NULL OR lease_until <= {now})"
        f" RETURNING {_BEFORE_WIDE}, {wide}, {_AFTER_WIDE}, {size}, available_at{clock}"
    )
    return sql, params


def leased_rows_sql(ids: Sequence[int]) -> tuple[str, tuple[Any, ...]]:
    """PostgreSQL: :data:`LEASED_COLUMNS` of ``ids`` that ``?`` still leases. Parameters:
    ``(*ids, owner)``."""
    chosen, params = in_list("postgresql", "id", ids)
    return (
        f"SELECT {LEASED_COLUMNS} FROM amqp_lab_outbox WHERE {chosen} AND lease_owner = ?",
        params,
    )


def after_sql(dialect: Dialect) -> str:
    """The first ``?`` pending rows of key ``?`` after id ``?`` (SQLite, per key), or of each
    key after its id (PostgreSQL, parameters ``(keys, ids, per_key)``, the lists as
    :func:`array_literal` texts): (id, key, size,
    available_at, lease_until) in (key, id) order."""
    columns = f"id, ordering_key, {size_sql(dialect)} AS size, available_at, lease_until"
    if dialect == "postgresql":
        return (
            "SELECT f.id, f.ordering_key, f.size, f.available_at, f.lease_until"
            " FROM unnest(?::text[], ?::bigint[]) AS k(key, after) CROSS JOIN LATERAL"
            f" (SELECT {columns} FROM amqp_lab_outbox WHERE ordering_key = k.key"
            " AND id > k.after AND sent_at IS NULL ORDER BY id LIMIT ?) f"
            " ORDER BY f.ordering_key, f.id"
        )
    return (
        f"SELECT {columns} FROM amqp_lab_outbox WHERE ordering_key = CAST(? AS TEXT) AND id > ?"
        " AND sent_at IS NULL ORDER BY id LIMIT ?"
    )


def followers_sql(dialect: Dialect, keys: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
    """The first ``?`` pending rows of each of ``keys`` (heads included), in (key, id) order:
    (id, key, size, available_at, lease_until). Parameters: ``(*keys, per_key)``. PostgreSQL
    reads at most ``per_key`` index entries per key (LATERAL ... LIMIT)."""
    if dialect == "postgresql":
        sql = (
            "SELECT f.id, f.ordering_key, f.size, f.available_at, f.lease_until"
            " FROM unnest(?::text[]) AS k(key) CROSS JOIN LATERAL"
            f" (SELECT id, ordering_key, {size_sql(dialect)} AS size, available_at, lease_until"
            " FROM amqp_lab_outbox WHERE ordering_key = k.key AND sent_at IS NULL"
            " ORDER BY id LIMIT ?) f ORDER BY f.ordering_key, f.id"
        )
        return sql, (array_literal(keys),)
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
