"""Table locks on PostgreSQL. Opening a store takes none on a table that exists
(amqp_lab.dedup.ddl), and what reads the outbox for people - the health check,
``amqp-lab-relay status`` - gives up on a locked table with a clear error instead of hanging.

``CREATE INDEX IF NOT EXISTS`` takes a SHARE lock on its table before it looks for the index.
Run at every store's start it waited for each open transaction that wrote the table, and every
writer after it queued behind: a health check, a relay's start or a worker's start while one
transaction held an uncommitted outbox row (or claim) stopped every other writer until that
transaction ended. The tests that hold such a transaction open, or a lock, fail on the code
before; a missing index is still created, in the schema a ``CREATE`` would use."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from amqp_lab.dedup.postgres import PostgresDedupStore
from amqp_lab.errors import OutboxUnavailable
from amqp_lab.health import outbox_health
from amqp_lab.message import OutgoingMessage
from amqp_lab.outbox import add
from amqp_lab.outbox.store import OutboxStore
from tests.pgsupport import temp_database
from tests.support import ROOT, one_error_line

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def message(message_id: str) -> OutgoingMessage:
    return OutgoingMessage(body=b"{}", message_id=message_id, exchange="", routing_key="q")


def finishes(work: Callable[[], Any], seconds: float = 10.0) -> Any:
    """``work()`` on a thread; its result if it ended within ``seconds``, else the test fails
    (the thread is left: the open transaction ends with the test and frees it)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s: a table lock"
    return result[0]


@contextmanager
def open_transaction(url: str, statement: str, params: tuple[Any, ...] = ()) -> Iterator[None]:
    """A transaction that ran ``statement`` and stays open (no commit) until the block ends."""
    with psycopg.connect(url) as db:
        db.execute(statement, params)
        try:
            yield
        finally:
            db.rollback()


def test_a_health_check_and_a_writer_wait_for_no_open_outbox_transaction() -> None:
    with temp_database() as url:
        OutboxStore(url).close()
        with psycopg.connect(url) as long_one:
            add(long_one, message("open-1"))  # uncommitted: ROW EXCLUSIVE held on the table

            def health() -> int:
                store = OutboxStore(url)  # what outbox_health and amqp-lab-relay status do
                try:
                    return store.status().pending
                finally:
                    store.close()

            def writer() -> None:
                with psycopg.connect(url) as db:
                    add(db, message("committed-2"))
                    db.commit()

            assert finishes(health) == 0  # the open transaction's row is not seen
            finishes(writer)
            assert finishes(health) == 1
            long_one.commit()
        store = OutboxStore(url)
        assert store.status().pending == 2
        store.close()


def test_a_dedup_store_opens_while_a_handlers_claim_is_open() -> None:
    with temp_database() as url:
        PostgresDedupStore(url).close()
        claim = "INSERT INTO processed (message_id, processed_at) VALUES (%s, 0)"
        with open_transaction(url, claim, ("m-1",)):
            finishes(lambda: PostgresDedupStore(url).close())  # a worker starting


@pytest.mark.parametrize(
    ("open_store", "index"),
    [
        (lambda url: OutboxStore(url).close(), "amqp_lab_outbox_key"),
        (lambda url: PostgresDedupStore(url).close(), "processed_at_idx"),
    ],
    ids=["outbox", "dedup"],
)
def test_a_missing_index_is_created_again(open_store: Callable[[str], None], index: str) -> None:
    with temp_database() as url:
        open_store(url)
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(f"DROP INDEX {index}")
            assert db.execute("SELECT to_regclass(%s)", (index,)).fetchone() == (None,)
            open_store(url)
            assert db.execute("SELECT to_regclass(%s)::text", (index,)).fetchone() == (index,)


def test_a_health_check_of_a_locked_outbox_fails_within_its_lock_timeout() -> None:
    """A migration holding the table: the check says it cannot read the outbox instead of
    waiting for the migration (its caller exits 1 with that line)."""
    with temp_database() as url:
        OutboxStore(url).close()
        with open_transaction(url, "LOCK TABLE amqp_lab_outbox IN ACCESS EXCLUSIVE MODE"):

            def check() -> BaseException | None:
                try:
                    outbox_health(url, lock_timeout=0.5)
                except OutboxUnavailable as e:
                    return e
                return None

            error = finishes(check)
        assert isinstance(error, OutboxUnavailable)
        assert "lock timeout" in str(error)
        status, where = outbox_health(url)  # the lock gone: read as before
        assert status.pending == 0 and where == url


def test_relay_status_on_a_locked_outbox_is_one_error_line_not_a_hang() -> None:
    with temp_database() as url:
        OutboxStore(url).close()
        with open_transaction(url, "LOCK TABLE amqp_lab_outbox IN ACCESS EXCLUSIVE MODE"):
            started = time.monotonic()
            result = subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "relay.py"), "status", "--outbox-url", url],
                capture_output=True,
                text=True,
                timeout=40,
            )
            waited = time.monotonic() - started
        assert result.returncode == 1, result.stderr
        line = one_error_line(result.stderr)
        assert "cannot read the status of outbox" in line and "lock timeout" in line, line
        assert 9 < waited < 35, waited  # OPERATOR_LOCK_TIMEOUT, 10 s, then the error


def with_search_path(url: str, path: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{path.replace(',', '%2C')}"


@pytest.mark.parametrize(
    ("open_store", "table"),
    [
        (lambda url: OutboxStore(url).close(), "amqp_lab_outbox"),
        (lambda url: PostgresDedupStore(url).close(), "processed"),
    ],
    ids=["outbox", "dedup"],
)
def test_a_schema_first_on_the_search_path_gets_its_own_tables(
    open_store: Callable[[str], None], table: str
) -> None:
    """A schema per vhost (docs/dedup.md) with ``public`` after it on the search path: its
    tables are created in it, not found in ``public`` and shared (a lookup through the whole
    search path, as ``to_regclass(name)`` alone does, created nothing in the tenant's)."""
    with temp_database() as url:
        open_store(url)  # public's tables first
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("CREATE SCHEMA tenant")
            tenant = with_search_path(url, "tenant,public")
            open_store(tenant)
            where = db.execute("SELECT to_regclass(%s)::text", (f"tenant.{table}",)).fetchone()
            assert where == (f"tenant.{table}",)
            open_store(tenant)  # and once they exist there, nothing is created again
            public = db.execute("SELECT to_regclass(%s)::text", (f"public.{table}",)).fetchone()
            assert public == (table,)  # public's own, untouched (shown unqualified: on its path)
