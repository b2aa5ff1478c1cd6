"""Creating a store's tables without locking a table that exists (PostgreSQL).

``CREATE INDEX IF NOT EXISTS`` takes a SHARE lock on its table *before* it looks for the index
(measured on PostgreSQL 15: it waits for an open transaction that wrote the table, and gave up
on a 1 s ``lock_timeout``). A SHARE lock waits for every open transaction that wrote the
table, and every writer that comes after queues behind it. Run at each store's start - a
worker, a relay, a health check, ``amqp-lab-relay status`` - that held every writer of the
outbox, or every handler's claim, until the longest open transaction ended (a writer committing
one row waited 3 s behind a health check while another transaction stayed open 3 s).
:func:`create_missing` looks the relations up in the catalog first and runs the statements
only when one of them is missing (https://www.postgresql.org/docs/current/explicit-locking.html:
SHARE conflicts with the ROW EXCLUSIVE every ``INSERT`` / ``UPDATE`` / ``DELETE`` takes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from amqp_lab.dedup.arrays import array_literal
from amqp_lab.dedup.base import HandlerDb

__all__ = ["create_missing", "created_names"]

_CREATES = re.compile(r"\s*CREATE (?:UNIQUE )?(?:TABLE|INDEX) IF NOT EXISTS (\w+)", re.IGNORECASE)


def created_names(statements: Sequence[str]) -> list[str]:
    """The relation each ``CREATE TABLE / [UNIQUE] INDEX IF NOT EXISTS name`` statement of
    ``statements`` creates, in order. Raises ValueError for a statement of another kind: what
    it would do cannot be checked in the catalog."""
    names = []
    for statement in statements:
        found = _CREATES.match(statement)
        if found is None:
            raise ValueError(f"not a CREATE ... IF NOT EXISTS statement: {statement[:60]!r}")
        names.append(found.group(1))
    return names


def create_missing(db: HandlerDb, statements: Sequence[str], lock_key: int) -> bool:
    """Run ``statements`` (``CREATE ... IF NOT EXISTS``) in ``db``'s transaction unless every
    relation they create exists; whether they ran. PostgreSQL: the relations are looked up with
    ``to_regclass`` (the search path's, as the statements resolve them), a plain catalog read
    that locks no table; when one is missing the statements run under
    ``pg_advisory_xact_lock(lock_key)`` (two first creations at once collide in ``pg_type``).
    SQLite: they run (its ``IF NOT EXISTS`` waits for nothing but the transaction's own write
    lock). Raises ValueError for a statement :func:`created_names` cannot read, and the
    driver's errors."""
    if db.dialect == "postgresql":
        names = created_names(statements)
        row = db.execute(
            "SELECT count(to_regclass(n)) FROM unnest(?::text[]) AS n", (array_literal(names),)
        ).fetchone()
        if row is not None and int(row[0]) == len(names):
            return False
        db.execute("SELECT pg_advisory_xact_lock(?)", (lock_key,))
    for statement in statements:
        db.execute(statement)
    return True
