"""A PostgreSQL server that takes no writes (pure: no I/O).

After a failover the old primary comes back as a standby, while a DNS name, a load balancer or
a pooler still sends new sessions to it; or an operator turns on
``default_transaction_read_only`` for maintenance. Sessions open and read, and every write
fails with SQLSTATE 25006, ``read_only_sql_transaction`` ("cannot execute INSERT in a
read-only transaction"; on a standby "cannot execute ... during recovery",
https://www.postgresql.org/docs/current/hot-standby.html). A session keeps its read-only
default for its life, so a store that kept it would fail for good even once a writable primary
is back: HikariCP#1802 (a pooled connection to the old primary, read-only after it restarted
as a standby), keycloak#22422 (Patroni and PgBouncer, cured only by a restart),
influxdb_iox#5570 (an RDS failover), cloudnative-pg#1254; node-mysql2#4075 answers MySQL's
equivalent by discarding the connection. psycopg files the error under ``InternalError``,
not ``OperationalError``, so without this test it read as a fault of the statement: the
relay stopped, and a worker stopped at its first claim.

The same SQLSTATE answers a write in a transaction the caller made read-only (``SET TRANSACTION
READ ONLY``, psycopg's ``read_only``): that is the caller's fault, not an outage. The two are
told apart by what the server reports of the session itself (PostgreSQL 14 and later report
``in_hot_standby`` and ``default_transaction_read_only`` to the client as they change; an
older server reports neither, and the refusal counts as the session's).

The stores treat the session's refusal as an outage of the database: the transaction is
rolled back, the connection closed (a new one may reach the primary: a multi-host URL with
``target_session_attrs=read-write`` picks it), and the call is retried like any other outage
(:class:`~amqp_lab.dedup.postgres.PostgresDedupStore`, :class:`~amqp_lab.outbox.db.OutboxDb`,
:func:`amqp_lab.outbox.add`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

__all__ = ["READ_ONLY_SQLSTATE", "read_only_server", "read_only_session", "reported"]

READ_ONLY_SQLSTATE = "25006"
"""read_only_sql_transaction: a write in a read-only transaction, or on a standby."""

Parameter = Callable[[str], "str | None"]
"""What the server last reported of a session parameter (psycopg's
``connection.info.parameter_status``), None when it reported nothing."""


def read_only_session(parameter: Parameter) -> bool:
    """Whether the session itself takes no writes, by what the server reported: it is a
    standby (``in_hot_standby``) or its default is read-only (``default_transaction_read_only``).
    True when the server reported neither (before PostgreSQL 14: it cannot be told)."""
    standby, default = parameter("in_hot_standby"), parameter("default_transaction_read_only")
    if standby is None and default is None:
        return True
    return "on" in (standby, default)


def read_only_server(error: BaseException | None, parameter: Parameter) -> bool:
    """Whether ``error`` is PostgreSQL refusing a write because the session is read-only: a
    psycopg.Error with SQLSTATE :data:`READ_ONLY_SQLSTATE` on a session
    :func:`read_only_session` finds read-only (``parameter``: the session's reported
    parameters); a transaction the caller made read-only is not."""
    if not isinstance(error, psycopg.Error) or error.sqlstate != READ_ONLY_SQLSTATE:
        return False
    return read_only_session(parameter)


def reported(connection: Any) -> Parameter:
    """The reported parameters of a psycopg connection (None for each once it is closed, or
    without a connection)."""

    def parameter(name: str) -> str | None:
        if connection is None:
            return None
        try:
            value: str | None = connection.info.parameter_status(name)
        except psycopg.Error:
            return None
        return value

    return parameter
