"""Creating a store's tables without locking a table that exists (PostgreSQL).

``CREATE INDEX IF NOT EXISTS`` takes a SHARE lock on its table *before* it looks for the index
(measured on PostgreSQL 15: it waits for an open transaction that wrote the table, and gave up
on a 1 s ``lock_timeout``). A SHARE lock waits for every open transaction that wrote the
table, and every writer that comes after queues behind it. Run at each store's start - a
worker, a relay, a health check, ``amqp-lab-relay status`` - that held every writer of the
outbox, or every handler's claim, until the longest open transaction ended (a writer committing
one row waited 3 s behind a health check while another transaction stayed open 3 s).
:func:`create_missing` looks the relations up in the catalog first and runs the statements
only for what is missing (https://www.postgresql.org/docs/current/explicit-locking.html:
SHARE conflicts with the ROW EXCLUSIVE every ``INSERT`` / ``UPDATE`` / ``DELETE`` takes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from amqp_lab.dedup.arrays import array_literal
from amqp_lab.dedup.base import HandlerDb

__all__ = ["create_missing", "created_names"]

_CREATES = re.compile(
    r"\s*CREATE (?:UNIQUE )?(?:TABLE|INDEX) IF NOT EXISTS (\w+)(?=\s|\(|$)", re.IGNORECASE
)
_EXISTING = (
    "SELECT n FROM unnest(?::text[]) AS n"
    " WHERE to_regclass(quote_ident(current_schema()) || '.' || quote_ident(n)) IS NOT NULL"
)
"""Which of the names exist in the schema a ``CREATE`` without a schema creates in: the first
of the search path that exists (``current_schema()``). Not ``to_regclass(n)`` alone, which
finds a name in *any* schema of the search path: with ``search_path = tenant, public`` and the
tables in ``public``, a tenant's tables were never created and its claims went to ``public``'s
(review). No schema to create in: NULL, so the statements run and fail as they always did."""


def created_names(statements: Sequence[str]) -> list[str]:
    """The relation each ``CREATE TABLE / [UNIQUE] INDEX IF NOT EXISTS name`` statement of
    ``statements`` creates, in order. Raises ValueError for a statement of another kind, or
    one whose name is schema-qualified or quoted: what it would do cannot be checked in the
    catalog."""
    names = []
    for statement in statements:
        found = _CREATES.match(statement)
        if found is None:
            raise ValueError(f"not a CREATE ... IF NOT EXISTS statement: {statement[:60]!r}")
        names.append(found.group(1).lower())  # unquoted: PostgreSQL folds it to lower case
    return names


def create_missing(db: HandlerDb, statements: Sequence[str], lock_key: int) -> bool:
    """Run those of ``statements`` (``CREATE ... IF NOT EXISTS``, in order) whose relation is
    missing, in ``db``'s transaction; whether any ran. PostgreSQL: the relations are looked up
    in the schema the statements create in (:data:`_EXISTING`: ``to_regclass``, a catalog read
    that locks no table); when one is missing, again under ``pg_advisory_xact_lock(lock_key)``
    (two first creations at once collide in ``pg_type``), and only the missing ones run - an
    upgrade that adds one table does not lock the others. SQLite: every statement runs (its
    ``IF NOT EXISTS`` waits for nothing but the transaction's own write lock). Raises
    ValueError for a statement :func:`created_names` cannot read, and the driver's errors."""
    if db.dialect != "postgresql":
        for statement in statements:
            db.execute(statement)
        return True
    names = created_names(statements)

    def existing() -> set[str]:
        rows = db.execute(_EXISTING, (array_literal(names),)).fetchall()
        return {str(r[0]) for r in rows}

    if existing() >= set(names):
        return False
    db.execute("SELECT pg_advisory_xact_lock(?)", (lock_key,))
    there = existing()
    missing = [s for s, name in zip(statements, names, strict=True) if name not in there]
    for statement in missing:
        db.execute(statement)
    return bool(missing)
