"""amqp_lab.dedup.read_only: a write refused because the session is read-only (a standby after
a failover, ``default_transaction_read_only``), told apart from every other error - and from a
transaction the caller made read-only on a writable session."""

from __future__ import annotations

import psycopg
import pytest

from amqp_lab.dedup.read_only import (
    READ_ONLY_SQLSTATE,
    Parameter,
    read_only_server,
    read_only_session,
    reported,
)

pytestmark = pytest.mark.unit

REFUSED = psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction")


def session(**reported: str) -> Parameter:
    """What a server reported of a session: its parameters, None for the rest."""
    return reported.get


STANDBY = session(in_hot_standby="on", default_transaction_read_only="off")
READ_ONLY_DEFAULT = session(in_hot_standby="off", default_transaction_read_only="on")
WRITABLE = session(in_hot_standby="off", default_transaction_read_only="off")
OLD_SERVER = session()  # before PostgreSQL 14: neither is reported


@pytest.mark.parametrize(
    "error",
    [REFUSED, psycopg.errors.ReadOnlySqlTransaction("cannot execute LISTEN during recovery")],
)
@pytest.mark.parametrize("parameter", [STANDBY, READ_ONLY_DEFAULT, OLD_SERVER])
def test_a_write_refused_by_a_read_only_session(error: Exception, parameter: Parameter) -> None:
    assert error.sqlstate == READ_ONLY_SQLSTATE  # type: ignore[attr-defined]
    assert read_only_server(error, parameter)


def test_a_transaction_made_read_only_on_a_writable_session_is_the_callers() -> None:
    assert not read_only_session(WRITABLE)
    assert not read_only_server(REFUSED, WRITABLE)
    assert not read_only_server(REFUSED, session(default_transaction_read_only="off"))


@pytest.mark.parametrize(
    "error",
    [
        # the same class of SQLSTATE (25, invalid transaction state), another condition
        psycopg.errors.ActiveSqlTransaction("SET TRANSACTION ISOLATION LEVEL must be called"),
        psycopg.errors.InFailedSqlTransaction("current transaction is aborted"),
        psycopg.errors.IdleInTransactionSessionTimeout("terminating connection"),
        # the words without the SQLSTATE: not the server's answer
        psycopg.InternalError("cannot execute INSERT in a read-only transaction"),
        psycopg.errors.InsufficientPrivilege("permission denied for table processed"),
        ValueError("cannot execute INSERT in a read-only transaction"),
        None,
    ],
)
def test_nothing_else_is_taken_for_it(error: Exception | None) -> None:
    assert not read_only_server(error, STANDBY)


def test_a_closed_connection_or_none_reports_nothing() -> None:
    class ClosedInfo:
        def parameter_status(self, name: str) -> str | None:
            raise psycopg.OperationalError("the connection is closed")

    class Closed:
        info = ClosedInfo()

    assert reported(Closed())("in_hot_standby") is None
    assert reported(None)("default_transaction_read_only") is None
