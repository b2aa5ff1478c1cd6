"""How a statement psycopg prepared on one server session shows on another (pure: no I/O).

psycopg 3 prepares a statement on the server after it ran five times on one connection
(``prepare_threshold``), naming it ``_pg3_N``
(https://www.psycopg.org/psycopg3/docs/advanced/prepare.html). A connection pooler in
transaction mode that keeps no prepared statement per client (PgBouncer before 1.21, or
without ``max_prepared_statements``) hands each transaction to any of its server sessions,
where that name does not exist, exists already, or takes other parameters. The server says so
with one of three SQLSTATEs and a primary message naming the statement; the stores turn such an
error into an outage and stop preparing (:class:`~amqp_lab.dedup.postgres.PostgresDedupStore`,
:class:`~amqp_lab.outbox.db.OutboxDb`). The test is narrow on purpose: an error whose detail
merely quotes a value like ``"_pg3_x"`` (a unique violation on a handler's data) is not one.
"""

from __future__ import annotations

import psycopg

__all__ = ["PREPARED_SQLSTATES", "prepared_elsewhere"]

PREPARED_SQLSTATES = frozenset(
    {
        "26000",  # invalid_sql_statement_name: prepared statement "_pg3_0" does not exist
        "42P05",  # duplicate_prepared_statement: prepared statement "_pg3_0" already exists
        "08P01",  # protocol_violation: bind message supplies 2 parameters, but prepared ...
    }
)
"""The SQLSTATEs of a prepared statement met on the wrong server session."""

_NAMED = 'prepared statement "_pg3_'


def prepared_elsewhere(error: BaseException | None) -> bool:
    """Whether ``error`` is the server's answer to a psycopg-prepared statement met on another
    server session: a psycopg.Error with one of :data:`PREPARED_SQLSTATES` whose primary
    message (its whole text when the server gave none) names ``_pg3_N``."""
    if not isinstance(error, psycopg.Error) or error.sqlstate not in PREPARED_SQLSTATES:
        return False
    message = error.diag.message_primary or str(error)
    return _NAMED in message
