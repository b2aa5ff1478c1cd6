"""amqp_lab.dedup.pooler and the HandlerDb's mark: a statement psycopg prepared, met on another
server session (a pooler in transaction mode), told apart from every other error."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from amqp_lab.dedup.handler_db import HandlerDb, on_store_connection
from amqp_lab.dedup.pooler import PREPARED_SQLSTATES, prepared_elsewhere

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


def test_an_error_of_a_statement_on_the_stores_connection_is_marked_as_such() -> None:
    connection = sqlite3.connect(":memory:")
    db = HandlerDb(connection, "sqlite")
    with pytest.raises(sqlite3.OperationalError) as raised:
        db.execute("SELECT * FROM missing")
    assert on_store_connection(raised.value)
    with pytest.raises(sqlite3.OperationalError) as raised:
        db.executemany("INSERT INTO missing VALUES (?)", [(1,)])
    assert on_store_connection(raised.value)
    with pytest.raises(sqlite3.OperationalError) as other:
        connection.execute("SELECT * FROM missing")  # not through the store's HandlerDb
    assert not on_store_connection(other.value)
    assert not on_store_connection(None)
