"""A PostgreSQL that takes no writes for a while: after a failover the old primary comes back
as a standby and new sessions still reach it, or an operator turns on
``default_transaction_read_only`` (:mod:`amqp_lab.dedup.read_only`). Every write fails with
SQLSTATE 25006, which psycopg files as an ``InternalError``. Before, that read as a fault of
the statement: the relay stopped for good, and a worker's dedup store raised a plain
DedupStoreError (the worker stops). And a session keeps its read-only default for its life,
so a store that kept its connection stayed read-only after the primary was back. Now it is an
outage: retried, the session replaced, nothing lost.

Here the database's own default turns read-only (``ALTER DATABASE ... SET``), which reaches
new sessions only - as a failover does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from amqp_lab.dedup import PostgresDedupStore
from amqp_lab.errors import OutboxError, OutboxUnavailable, StoreUnavailable
from amqp_lab.message import message_for
from amqp_lab.outbox import add
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings
from tests.integration.test_outbox_faults import commit_order, drained, first_seen_order, relays
from tests.pgsupport import ADMIN_URL, temp_database
from tests.support import NAMES, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.failure_model, pytest.mark.no_plain_consumer]


def read_only(url: str, on: bool) -> None:
    """Make the database of ``url`` read-only for the sessions that start from now on (or
    writable again); ``on`` also ends its sessions, as a failover does."""
    name = sql.Identifier(urlsplit(url).path.lstrip("/"))
    setting = (
        "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    )
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} " + setting).format(name))
        if on:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (urlsplit(url).path.lstrip("/"),),
            )


def counting(ran: list[str], message_id: str) -> Callable[[Any], None]:
    def work(db: Any) -> None:
        db.execute("INSERT INTO effects(message_id) VALUES (?)", (message_id,))
        ran.append(message_id)

    return work


def effects(url: str) -> list[str]:
    with psycopg.connect(url) as db:
        return [r[0] for r in db.execute("SELECT message_id FROM effects ORDER BY message_id")]


def fails_as_an_outage(call: Callable[[], Any]) -> None:
    """``call()`` raises StoreUnavailable - at once, or after the one that finds the session
    ended - naming the read-only transaction."""
    for _ in range(2):
        with pytest.raises(StoreUnavailable) as raised:
            call()
        if "read-only transaction" in str(raised.value):
            return
    pytest.fail(f"no read-only outage, last: {raised.value}")


@pytest.mark.timeout(60)
def test_a_dedup_store_on_a_read_only_server_is_an_outage_and_goes_on_once_it_takes_writes() -> (
    None
):
    with temp_database() as url:
        with psycopg.connect(url) as db:
            db.execute("CREATE TABLE effects(message_id TEXT PRIMARY KEY)")
        store = PostgresDedupStore(url)
        ran: list[str] = []
        try:
            assert store.process_once("m-0", counting(ran, "m-0"))
            read_only(url, True)
            fails_as_an_outage(lambda: store.process_once("m-1", counting(ran, "m-1")))
            fails_as_an_outage(lambda: store.process_once("m-1", counting(ran, "m-1")))
            read_only(url, False)  # its session stayed read-only: the store must replace it
            assert store.process_once("m-1", counting(ran, "m-1"))
            read_only(url, True)
            batch = [(m, counting(ran, m)) for m in ("m-1", "m-2", "m-3")]
            fails_as_an_outage(lambda: store.process_batch(batch))
            read_only(url, False)
            assert store.process_batch(batch) == [False, True, True]
        finally:
            store.close()
        assert ran == ["m-0", "m-1", "m-2", "m-3"]
        assert effects(url) == ["m-0", "m-1", "m-2", "m-3"]


@pytest.mark.timeout(60)
def test_a_transaction_the_handler_made_read_only_is_the_handlers_failure() -> None:
    """The same SQLSTATE on a writable session: the handler's error, retried or dead-lettered
    as any other, and the store's connection goes on."""
    with temp_database() as url:
        with psycopg.connect(url) as db:
            db.execute("CREATE TABLE effects(message_id TEXT PRIMARY KEY)")
        store = PostgresDedupStore(url)
        ran: list[str] = []

        def read_only_handler(db: Any) -> None:
            db.execute("SET TRANSACTION READ ONLY")  # allowed after the claim's write
            counting(ran, "m-0")(db)

        try:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                store.process_once("m-0", read_only_handler)
            batch = [("m-0", read_only_handler), ("m-1", counting(ran, "m-1"))]
            results = store.process_batch(batch)
            assert isinstance(results[0], psycopg.errors.ReadOnlySqlTransaction)
            assert results[1] is True
            assert store.process_once("m-0", counting(ran, "m-0"))
        finally:
            store.close()
        assert ran == ["m-1", "m-0"]
        assert effects(url) == ["m-0", "m-1"]


@pytest.mark.timeout(30)
def test_a_writer_on_a_read_only_server_gets_an_outage_to_retry() -> None:
    with temp_database() as url:
        OutboxStore(url).close()
        read_only(url, True)
        with (
            psycopg.connect(url) as db,
            pytest.raises(OutboxUnavailable, match="read-only transaction"),
        ):
            add(db, message_for(NAMES, {"n": 0}, message_id="k/0"), key="k")
        read_only(url, False)
        with psycopg.connect(url) as db:  # the retry, on a new connection
            assert add(db, message_for(NAMES, {"n": 0}, message_id="k/0"), key="k")
        with (
            psycopg.connect(url) as db,
            pytest.raises(OutboxError, match="read-only transaction") as raised,
        ):
            db.read_only = True  # the writer's own read-only transaction: its fault, no outage
            add(db, message_for(NAMES, {"n": 1}, message_id="k/1"), key="k")
        assert not isinstance(raised.value, OutboxUnavailable)


@pytest.mark.timeout(120)
def test_a_relay_on_a_read_only_server_waits_and_relays_every_row_once_it_takes_writes(
    topology: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    with temp_database() as url:
        OutboxStore(url).close()
        with psycopg.connect(url) as db:
            for i in range(12):
                key = f"k{i % 3}"
                add(db, message_for(NAMES, {"n": i}, message_id=f"{key}/{i}"), key=key)
            db.commit()
        read_only(url, True)
        with caplog.at_level(logging.WARNING, "amqp_lab.outbox"):
            with relays(topology, url, 1, poll=0.2) as (relay,):
                wait_for(
                    lambda: "read-only transaction" in caplog.text,
                    30,
                    0.2,
                    "the relay's outage warning",
                )
                assert relay.failure is None
                assert "database is unavailable" in caplog.text
                read_only(url, False)  # its sessions stayed read-only: the relay replaces them
                drained(url)
                wait_for(lambda: "database is back" in caplog.text, 30, 0.2, "the recovery")
            assert relay.failure is None
        got, duplicates = first_seen_order(topology)
        assert got == commit_order(url)
        assert sum(len(v) for v in got.values()) == 12
        assert duplicates == 0
