"""Failure model, the dedup store: its connection lost (PostgreSQL cut off, its session
terminated) or SQLite locked past its timeout. The delivery is retried - not acked, not lost -
and only a store that stays down past ``store_outage`` ends the consumer, non-zero."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.dedup.postgres import PostgresDedupStore
from amqp_lab.errors import DedupStoreError
from amqp_lab.message import Task
from amqp_lab.settings import BrokerSettings
from lab.handler import lab_handler
from tests.faultproxy import FaultProxy
from tests.integration.test_failure_model import Running
from tests.pgsupport import temp_database
from tests.support import consumer_config, publish, ready_count, settled_order, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def _pg_effects(url: str) -> list[str]:
    with psycopg.connect(url) as db:
        return sorted(r[0] for r in db.execute("SELECT message_id FROM effects"))


def _slow_lab(seconds: float) -> Any:
    def handle(task: Task, db: Any) -> None:
        time.sleep(seconds)
        lab_handler(task, db)

    return handle


@pytest.fixture
def pg_url() -> Any:
    with temp_database() as url:
        yield url


@pytest.mark.timeout(120)
def test_postgres_cut_off_and_back_loses_nothing_and_applies_once(
    topology: BrokerSettings, pg_url: str
) -> None:
    target = urlsplit(pg_url)
    with FaultProxy((target.hostname or "127.0.0.1", target.port or 5432)) as proxy:
        store = PostgresDedupStore(_via(pg_url, proxy.port), connect_timeout=2)
        reports: list[DeliveryReport] = []
        consumer = Consumer(
            topology,
            _slow_lab(0.05),
            store,
            consumer_config(store_outage=60),
            on_report=reports.append,
        )
        running = Running(consumer)
        publish(topology, *[("ok", f"m-{i}") for i in range(40)])
        wait_for(lambda: len(reports) >= 5, what="a few processed")
        proxy.refuse()
        proxy.cut()  # the database is gone mid-transaction...
        time.sleep(2)  # ...for a while (the outage itself is the scenario)
        proxy.accept()  # ...and back
        wait_for(lambda: len({r.message_id for r in reports}) == 40, 60, what="all 40 settled")
        consumer.stop()
        running.join()
        store.close()
    assert running.error is None
    assert {r.outcome for r in reports} <= {"processed", "duplicate"}
    assert _pg_effects(pg_url) == sorted(f"m-{i}" for i in range(40))  # each applied once
    assert ready_count(topology, "q:tasks") == 0


@pytest.mark.timeout(120)
def test_postgres_session_terminated_mid_handler_is_retried(
    topology: BrokerSettings, pg_url: str
) -> None:
    store = PostgresDedupStore(pg_url)
    reports: list[DeliveryReport] = []
    in_handler = threading.Event()

    def handler(task: Task, db: Any) -> None:
        lab_handler(task, db)
        in_handler.set()
        time.sleep(1)  # the session is terminated here, inside the transaction

    running = Running(
        Consumer(topology, handler, store, consumer_config(), on_report=reports.append)
    )
    publish(topology, ("ok", "m-1"), ("ok", "m-2"))
    assert in_handler.wait(20)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'amqp-lab dedup' AND datname = current_database() "
            "AND state = 'idle in transaction'"  # the handler thread's session, mid-handler
        ).fetchone()
    assert killed == (1,)
    wait_for(lambda: len(reports) == 2, 30, what="both settled")
    running.consumer.stop()
    running.join()
    store.close()
    assert running.error is None
    assert settled_order([(r.message_id, r.outcome) for r in reports]) == [
        ("m-1", "processed"),
        ("m-2", "processed"),
    ]
    assert _pg_effects(pg_url) == ["m-1", "m-2"]


@pytest.mark.timeout(120)
def test_a_store_down_past_its_bound_stops_the_consumer_without_acking(
    topology: BrokerSettings, pg_url: str
) -> None:
    target = urlsplit(pg_url)
    with FaultProxy((target.hostname or "127.0.0.1", target.port or 5432)) as proxy:
        store = PostgresDedupStore(_via(pg_url, proxy.port), connect_timeout=1)
        proxy.refuse()
        proxy.cut()
        publish(topology, *[("ok", f"m-{i}") for i in range(3)])
        consumer = Consumer(topology, lab_handler, store, consumer_config(store_outage=3))
        started = time.monotonic()
        with pytest.raises(DedupStoreError, match="stayed unavailable"):
            consumer.run()
        assert time.monotonic() - started < 30
        store.close()
    wait_for(lambda: ready_count(topology, "q:tasks") == 3, what="nothing acked: all back")


@pytest.mark.timeout(120)
def test_sqlite_locked_past_its_timeout_is_retried(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    path = tmp_path / "d.sqlite3"
    store = SqliteDedupStore(path, busy_timeout=0.2)
    reports: list[DeliveryReport] = []
    running = Running(
        Consumer(topology, lab_handler, store, consumer_config(), on_report=reports.append)
    )
    publish(topology, ("ok", "m-0"))
    wait_for(lambda: len(reports) == 1, what="first processed")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock...
    publish(topology, ("ok", "m-1"), ("ok", "m-2"))
    time.sleep(1.5)  # ...for seven times the store's busy timeout
    assert len(reports) == 1  # nothing was acked while the store was locked
    other.execute("ROLLBACK")
    other.close()
    wait_for(lambda: len(reports) == 3, what="the rest processed after the lock")
    running.consumer.stop()
    running.join()
    store.close()
    assert running.error is None
    # m-1 and m-2 settle as they finish when handlers run concurrently (CI's concurrency 4)
    assert settled_order([(r.message_id, r.outcome) for r in reports]) == [
        ("m-0", "processed"),
        ("m-1", "processed"),
        ("m-2", "processed"),
    ]
