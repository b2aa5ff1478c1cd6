"""amqp_lab.dedup.ddl: which relation each schema statement creates, read from the statement,
so opening a store can check the catalog instead of running DDL that locks a table."""

from __future__ import annotations

import sqlite3

import pytest

from amqp_lab.dedup.base import HandlerDb
from amqp_lab.dedup.base import schema as dedup_schema
from amqp_lab.dedup.ddl import create_missing, created_names
from amqp_lab.outbox.schema import schema as outbox_schema

pytestmark = pytest.mark.unit


def test_every_outbox_and_dedup_statement_names_what_it_creates() -> None:
    assert created_names(outbox_schema("postgresql")) == [
        "amqp_lab_outbox",
        "amqp_lab_outbox_message_id",
        "amqp_lab_outbox_pending",
        "amqp_lab_outbox_key",
        "amqp_lab_outbox_sent",
        "amqp_lab_outbox_relays",
    ]
    assert created_names(dedup_schema("postgresql")) == [
        "processed",
        "first_seen",
        "redeliveries",
        "failures",
        "processed_at_idx",
        "first_seen_at_idx",
        "redeliveries_last_at_idx",
        "failures_last_at_idx",
    ]
    for schema in (outbox_schema, dedup_schema):  # the same relations in both dialects
        assert created_names(schema("sqlite")) == created_names(schema("postgresql"))


def test_an_unquoted_name_is_looked_up_as_postgresql_folds_it() -> None:
    # CREATE TABLE Foo creates foo: looked up as "Foo" it was never found, created every time
    assert created_names(["CREATE TABLE IF NOT EXISTS Foo (a INTEGER)"]) == ["foo"]


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE INDEX amqp_lab_outbox_key ON amqp_lab_outbox (ordering_key)",  # no IF NOT EXISTS
        "ALTER TABLE amqp_lab_outbox ADD COLUMN x TEXT",
        "DROP INDEX IF EXISTS amqp_lab_outbox_key",
        "CREATE TABLE IF NOT EXISTS app.outbox (a INTEGER)",  # schema-qualified: not `app`
        'CREATE TABLE IF NOT EXISTS "Outbox" (a INTEGER)',  # quoted
    ],
)
def test_a_statement_whose_effect_cannot_be_checked_is_refused(statement: str) -> None:
    with pytest.raises(ValueError, match="not a CREATE"):
        created_names(["CREATE TABLE IF NOT EXISTS t (a INTEGER)", statement])


def test_sqlite_runs_the_statements_every_time_and_they_are_idempotent() -> None:
    connection = sqlite3.connect(":memory:")
    db = HandlerDb(connection, "sqlite")
    assert create_missing(db, outbox_schema("sqlite"), 1) is True
    assert create_missing(db, outbox_schema("sqlite"), 1) is True
    tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
    assert set(created_names(outbox_schema("sqlite"))) <= tables
