"""amqp_lab.dedup.pooler and the HandlerDb's mark: a statement psycopg prepared, met on another
server session (a pooler in transaction mode), told apart from every other error."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from amqp_lab.dedup.handler_db import HandlerDb, run_in_savepoint
from amqp_lab.dedup.pooler import PREPARED_SQLSTATES, prepared_elsewhere
from amqp_lab.errors import DedupStoreError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist'),
        psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_12" already exists'),
        psycopg.errors.ProtocolViolation(
            'bind message supplies 2 parameters, but prepared statement "_pg3_3" requires 1'
        ),
    ],
)
def test_the_servers_three_answers_to_a_statement_prepared_elsewhere(error: Exception) -> None:
    assert error.sqlstate in PREPARED_SQLSTATES  # type: ignore[attr-defined]
    assert prepared_elsewhere(error)


@pytest.mark.parametrize(
    "error",
    [
        # a handler's data quoted in a detail: not a pooler
        psycopg.errors.UniqueViolation(
            'duplicate key value violates unique constraint "t_pkey"'
            ' DETAIL: Key (k)=("_pg3_x") already exists.'
        ),
        psycopg.errors.InvalidTextRepresentation('invalid input syntax: "_pg3_1"'),
        # a statement of the application's own name
        psycopg.errors.InvalidSqlStatementName('prepared statement "mine" does not exist'),
        psycopg.errors.ProtocolViolation("server closed the connection unexpectedly"),
        psycopg.OperationalError('prepared statement "_pg3_0" does not exist'),  # no SQLSTATE
        ValueError('prepared statement "_pg3_0" does not exist'),
        None,
    ],
)
def test_nothing_else_is_taken_for_it(error: Exception | None) -> None:
    assert not prepared_elsewhere(error)


def test_the_store_is_told_of_each_failed_statement_on_its_connection_raised_unchanged() -> None:
    connection = sqlite3.connect(":memory:")
    told: list[BaseException] = []
    db = HandlerDb(connection, "sqlite", on_error=told.append)
    with pytest.raises(sqlite3.OperationalError) as missing:
        db.execute("SELECT * FROM missing")
    with pytest.raises(sqlite3.OperationalError) as many:
        db.executemany("INSERT INTO missing VALUES (?)", [(1,)])
    with pytest.raises(OverflowError) as overflow:  # a built-in error, raised as it was
        db.execute("SELECT ?", (2**70,))
    assert told == [missing.value, many.value, overflow.value]
    connection.execute("SELECT 1")  # not through the store's HandlerDb: not told
    assert len(told) == 3
    assert db.execute("SELECT 2").fetchone() == (2,)


class _RefusingSavepoints:
    """A connection whose savepoint statements fail, as a pooler's would."""

    def __init__(self, refuse: str) -> None:
        self.refuse = refuse
        self.error = sqlite3.OperationalError(f"{refuse} refused")

    def execute(self, sql: str, *params: object) -> None:
        if sql.startswith(self.refuse):
            raise self.error


@pytest.mark.parametrize("refuse", ["SAVEPOINT", "RELEASE", "ROLLBACK TO"])
def test_the_store_is_told_of_a_failed_savepoint_statement_too(refuse: str) -> None:
    connection = _RefusingSavepoints(refuse)
    told: list[BaseException] = []

    def work(db: HandlerDb) -> None:
        db.execute("SELECT 1")
        if refuse == "ROLLBACK TO":
            raise ValueError("the handler failed")

    with pytest.raises(DedupStoreError, match=f"{refuse} delivery failed"):
        run_in_savepoint(connection, "sqlite", work, lambda: None, told.append)
    assert told == [connection.error]
