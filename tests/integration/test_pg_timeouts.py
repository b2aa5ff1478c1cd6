"""PostgreSQL ending the dedup store's transaction for a time limit of its own
(``idle_in_transaction_session_timeout`` here; ``transaction_timeout`` on PostgreSQL 17 takes
the same way) while a handler holds it: waiting outside the database (an HTTP call, a sleep)
longer than the limit. Before, the lost session read as an outage of the store: retried at
once, the handler run again and timed out again until ``store_outage`` stopped the worker, and
the redelivered message then stopped the next worker. Now it is the handler's failure
(TransactionTimedOut, a TransientError): retried a bounded number of times and dead-lettered,
nothing of it committed, the worker and the rest of the queue going on
(:mod:`amqp_lab.dedup.timeouts`). PgBouncer's ``idle_transaction_timeout`` too."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import PostgresDedupStore
from amqp_lab.errors import DedupStoreError, TransactionTimedOut, TransientError
from amqp_lab.message import Task
from amqp_lab.settings import BrokerSettings
from lab.handler import lab_handler
from lab.pg_node import PgNode, PgNodeError, find_bin_dir
from tests.integration.test_failure_model import Running
from tests.pgbouncer import PgBouncer, unavailable
from tests.pgsupport import ADMIN_URL, temp_database
from tests.support import consumer_config, publish, ready_count, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]

LIMIT = 1.0  # the database's idle_in_transaction_session_timeout, seconds
OVER = LIMIT + 0.8  # a handler's wait outside the database


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A database whose sessions are ended after LIMIT seconds idle in a transaction."""
    with temp_database() as url:
        name = sql.Identifier(urlsplit(url).path.lstrip("/"))
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = {}").format(
                    name, sql.Literal(f"{int(LIMIT * 1000)}ms")
                )
            )
        with psycopg.connect(url) as db:
            db.execute("CREATE TABLE writes(message_id TEXT PRIMARY KEY)")
        yield url


def write(db: Any, message_id: str) -> None:
    db.execute("INSERT INTO writes(message_id) VALUES (?)", (message_id,))


def written(url: str) -> list[str]:
    with psycopg.connect(url) as db:
        return [r[0] for r in db.execute("SELECT message_id FROM writes ORDER BY message_id")]


def waits_then_returns(db: Any) -> None:
    write(db, "m")
    time.sleep(OVER)  # the commit finds the session ended


def waits_then_writes(db: Any) -> None:
    time.sleep(OVER)
    write(db, "m")  # the handler's own statement finds it


def waits_then_catches(db: Any) -> None:
    time.sleep(OVER)
    with contextlib.suppress(psycopg.Error):  # and returns as if it had worked
        write(db, "m")


def waits_then_wraps(db: Any) -> None:
    time.sleep(OVER)
    try:
        write(db, "m")
    except psycopg.Error as e:
        raise ValueError("the handler's own error") from e


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "handler", [waits_then_returns, waits_then_writes, waits_then_catches, waits_then_wraps]
)
def test_a_transaction_the_database_ends_for_its_time_limit_is_the_handlers_failure(
    pg_url: str, handler: Callable[[Any], None]
) -> None:
    store = PostgresDedupStore(pg_url)
    try:
        with pytest.raises(TransactionTimedOut, match="idle_in_transaction_session_timeout") as e:
            store.process_once("m", handler)
        assert isinstance(e.value, TransientError)
        assert not isinstance(e.value, DedupStoreError)  # not an outage of the store
        assert store.process_once("m", lambda db: write(db, "m"))  # nothing was committed
    finally:
        store.close()
    assert written(pg_url) == ["m"]


@pytest.mark.timeout(60)
def test_a_handlers_own_connection_ended_for_its_time_limit_is_the_handlers_error(
    pg_url: str,
) -> None:
    """Only the store's session counts: a handler's other connection (here to a database with
    the limit, the store's has none) ending alone fails that handler as any error of its own."""
    ran: list[str] = []

    def own_connection(message_id: str) -> Callable[[Any], None]:
        def work(db: Any) -> None:
            with psycopg.connect(pg_url) as own:
                own.execute("SELECT 1")  # a transaction open on its own connection...
                time.sleep(OVER)  # ...idle past the limit of its database
                own.execute("SELECT 1")
            ran.append(message_id)

        return work

    with temp_database() as store_url:
        store = PostgresDedupStore(store_url)
        try:
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                store.process_once("m", own_connection("m"))
            results = store.process_batch([("a", lambda db: None), ("b", own_connection("b"))])
            assert results[0] is True
            assert isinstance(results[1], psycopg.errors.IdleInTransactionSessionTimeout)
            assert store.process_once("m", lambda db: None)  # the store's session went on
        finally:
            store.close()
    assert ran == []


@pytest.mark.timeout(60)
def test_a_batch_whose_transaction_the_database_ends_commits_nothing_and_stops_there(
    pg_url: str,
) -> None:
    store = PostgresDedupStore(pg_url)
    ran: list[str] = []

    def handler(message_id: str, wait: float = 0.0) -> Callable[[Any], None]:
        def work(db: Any) -> None:
            ran.append(message_id)
            time.sleep(wait)
            write(db, message_id)

        return work

    try:
        batch = [("a", handler("a")), ("b", handler("b", OVER)), ("c", handler("c"))]
        with pytest.raises(TransactionTimedOut, match="idle_in_transaction_session_timeout"):
            store.process_batch(batch)
        assert ran == ["a", "b"]  # no handler ran on the ended session
        assert written(pg_url) == []
        assert store.process_batch([("a", handler("a")), ("c", handler("c"))]) == [True, True]
    finally:
        store.close()
    assert written(pg_url) == ["a", "c"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ack_batch", [1, 3])
def test_a_handler_holding_the_transaction_past_the_limit_is_dead_lettered_the_worker_goes_on(
    topology: BrokerSettings, pg_url: str, ack_batch: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch the database ended runs again one delivery at a time: the other deliveries of
    the batch are processed once, uncharged."""
    store = PostgresDedupStore(pg_url)
    reports: list[DeliveryReport] = []

    def handler(task: Task, db: Any) -> None:
        lab_handler(task, db)
        if task.message_id.startswith("slow"):
            time.sleep(OVER)

    consumer = Consumer(
        topology,
        handler,
        store,
        consumer_config(store_outage=10, ack_batch=ack_batch, prefetch=6, concurrency=1),
        on_report=reports.append,
    )
    publish(topology, ("ok", "fast-1"), ("ok", "slow-1"), ("ok", "fast-2"), ("ok", "fast-3"))
    wait_for(lambda: ready_count(topology, "q:tasks") == 4, what="all four queued")
    with caplog.at_level(logging.WARNING, "amqp_lab.consuming"):  # all four at once: batches
        running = Running(consumer)
    try:
        wait_for(
            lambda: (
                ("slow-1", "dead-lettered") in [(r.message_id, r.outcome) for r in reports]
                and len({r.message_id for r in reports}) == 4
            ),
            60,
            what="every delivery settled, slow-1 dead-lettered",
        )
    finally:
        consumer.stop()
        running.join()
        store.close()
    assert running.error is None, running.error
    outcomes = sorted((r.message_id, r.outcome) for r in reports)
    assert outcomes == [
        ("fast-1", "processed"),
        ("fast-2", "processed"),
        ("fast-3", "processed"),
        ("slow-1", "dead-lettered"),
        ("slow-1", "requeued"),
    ]
    with psycopg.connect(pg_url) as db:
        applied = sorted(r[0] for r in db.execute("SELECT message_id FROM effects"))
    assert applied == ["fast-1", "fast-2", "fast-3"]  # slow-1's writes never committed
    assert ready_count(topology, "q:tasks") == 0
    fallback = "deliveries run again one by one" in caplog.text
    assert fallback == (ack_batch > 1)  # slow-1's batch ran again alone, not charged to the rest


@pytest.mark.timeout(90)
def test_pgbouncers_idle_transaction_timeout_is_the_handlers_failure_too() -> None:
    """PgBouncer ends the client's connection with its own answer (08P01, "idle transaction
    timeout"): the same failure of the handler, not an outage."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    try:
        find_bin_dir()
    except PgNodeError as e:
        pytest.skip(f"a PostgreSQL of the test's own is needed behind the pooler: {e}")
    with PgNode() as node:
        node.create_database("app")
        settings = f"idle_transaction_timeout = {int(LIMIT)}\n"
        with PgBouncer(node, "app", settings=settings) as bouncer:
            with psycopg.connect(bouncer.url, prepare_threshold=None) as db:
                db.execute("CREATE TABLE writes(message_id TEXT PRIMARY KEY)")
            store = PostgresDedupStore(bouncer.url, prepare=False)
            try:
                for handler in (waits_then_returns, waits_then_writes):
                    with pytest.raises(
                        TransactionTimedOut, match="PgBouncer's idle_transaction_timeout"
                    ):
                        store.process_once("m", handler)
                assert store.process_once("m", lambda db: write(db, "m"))
            finally:
                store.close()
            assert written(bouncer.url) == ["m"]
