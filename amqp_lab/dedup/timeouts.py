"""PostgreSQL ending a transaction that was held too long (pure: no I/O).

A server, a role or a database may set ``idle_in_transaction_session_timeout`` (a session
idle inside a transaction longer than that is terminated, SQLSTATE 25P03) and, from
PostgreSQL 17, ``transaction_timeout`` (a transaction open longer than that, 25P04):
https://www.postgresql.org/docs/current/runtime-config-client.html. Managed services and
operators set them to reclaim sessions left open. The dedup store holds one transaction from
its claim to its commit, around the handler: a handler that waits longer than the limit
outside the database (an HTTP call, a sleep) or runs longer than it in all loses its session,
and its commit fails. The session is gone, which reads like an outage of the store - retried
at once, the handler run again, timed out again, until ``store_outage`` stops the worker, and
then the next worker - while it is the handler's time that failed. The store raises
:class:`~amqp_lab.errors.TransactionTimedOut` instead: a handler failure (retried a bounded
number of times, then dead-lettered).

PgBouncer's own ``idle_transaction_timeout`` ends the client's connection the same way, with
SQLSTATE 08P01 and the text "idle transaction timeout" (seen with PgBouncer 1.18): that
answer is recognised too. PgBouncer's other limits are not (a ``query_timeout`` is a
statement's, and another version may word them otherwise): they read as a lost connection.
"""

from __future__ import annotations

import psycopg

from amqp_lab.errors import TransactionTimedOut

__all__ = ["POOLER_TIMEOUTS", "TIMEOUT_SETTINGS", "server_timeout", "timed_out"]

TIMEOUT_SETTINGS = {
    "25P03": "idle_in_transaction_session_timeout",
    "25P04": "transaction_timeout",
}
"""SQLSTATE -> the server setting whose limit ended the transaction."""

POOLER_TIMEOUTS = {("08P01", "idle transaction timeout"): "PgBouncer's idle_transaction_timeout"}
"""(SQLSTATE, primary message) -> the pooler's setting whose limit ended the connection."""


def server_timeout(error: BaseException | None) -> str | None:
    """The setting whose limit made PostgreSQL (:data:`TIMEOUT_SETTINGS`) or PgBouncer
    (:data:`POOLER_TIMEOUTS`) end the transaction, when ``error`` - or the error it was raised
    from - is that answer; None otherwise."""
    seen = 0
    while error is not None and seen < 8:  # a handler's wrapper, at most a few levels
        if isinstance(error, psycopg.Error) and error.sqlstate in TIMEOUT_SETTINGS:
            return TIMEOUT_SETTINGS[error.sqlstate]
        if isinstance(error, psycopg.Error) and error.sqlstate == "08P01":
            message = (error.diag.message_primary or str(error)).strip()
            pooler = POOLER_TIMEOUTS.get((error.sqlstate, message))
            if pooler is not None:
                return pooler
        error = error.__cause__ or error.__context__
        seen += 1
    return None


def timed_out(context: str, errors: list[BaseException]) -> TransactionTimedOut | None:
    """TransactionTimedOut (its text starting with ``context``) when one of ``errors`` - or
    what it was raised from - is the server ending the transaction for a limit of its own;
    None otherwise."""
    for error in errors:
        setting = server_timeout(error)
        if setting is not None:
            return TransactionTimedOut(
                f"{context}: the database ended the transaction past its {setting} (the "
                "handler held it too long); nothing of it was committed"
            )
    return None
