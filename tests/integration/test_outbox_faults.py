"""The outbox when things go wrong around it: relays racing for rows, a PostgreSQL restarted
under a running relay and its writers, the broker's connection cut mid-publish, the broker
refusing connections at the relay's start, a memory alarm blocking the relay, a scheduled row
cancelled while a relay holds it, the outbox table locked under a running relay. Every
committed row is published, per key in commit order; a copy may go twice (the consumer's
dedup absorbs it), none is lost."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from amqp_lab.errors import OutboxError
from amqp_lab.message import message_for
from amqp_lab.outbox import CancelResult, add, cancel
from amqp_lab.outbox.observer import RelayConfig
from amqp_lab.outbox.relay import OutboxRelay
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings
from lab.pg_node import PgNode, PgNodeError, find_bin_dir
from tests.brokers import TestBroker
from tests.faultproxy import FaultProxy
from tests.integration.test_memory_alarm import memory_alarm
from tests.pgsupport import temp_database
from tests.support import NAMES, get_all, through, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.failure_model,
    pytest.mark.no_plain_consumer,
]


@contextmanager
def relays(
    settings: BrokerSettings, url: str, count: int, **config: Any
) -> Iterator[list[OutboxRelay]]:
    """``count`` relays on threads of this process, stopped (drained) at the end."""
    options: dict[str, Any] = {"poll": 0.05, "lease": 5.0, "keep_sent": 3600.0} | config
    started = [OutboxRelay(settings, url, RelayConfig(**options)) for _ in range(count)]
    for relay in started:
        relay.start_thread()
    try:
        yield started
    finally:
        for relay in started:
            relay.stop()
        for relay in started:
            relay.join(30)


def drained(url: str, timeout: float = 60) -> None:
    store = OutboxStore(url)
    try:
        wait_for(lambda: store.status().pending == 0, timeout, 0.2, "every row sent")
    finally:
        store.close()


def commit_order(url: str) -> dict[str, list[str]]:
    """Each key's message_ids in id order: the commit order (sent rows are kept)."""
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT ordering_key, message_id FROM amqp_lab_outbox ORDER BY id"
        ).fetchall()
    order: dict[str, list[str]] = {}
    for key, message_id in rows:
        order.setdefault(key, []).append(message_id)
    return order


def first_seen_order(settings: BrokerSettings) -> tuple[dict[str, list[str]], int]:
    """Each key's message_ids in queue order, first copies only; and how many copies were
    duplicates."""
    seen: Counter[str] = Counter()
    order: dict[str, list[str]] = {}
    for _, properties, _ in get_all(settings, "q:tasks"):
        seen[properties.message_id] += 1
        if seen[properties.message_id] == 1:
            key = properties.message_id.split("/")[0]
            order.setdefault(key, []).append(properties.message_id)
    return order, sum(n - 1 for n in seen.values())


def write_keyed(
    url: str,
    transactions: int,
    keys: int,
    tag: str,
    on_error: Callable[[BaseException], None],
    pause: float = 0.004,
) -> int:
    """``transactions`` transactions of two rows on random keys (message_id ``key/tag-n-i``),
    keys locked in sorted order; a transaction that fails is retried (a failed COMMIT's
    outcome is unknown: its rows exist, or not). Returns the transactions committed."""
    rng = random.Random(tag)
    committed = 0
    db: Any = None
    n = 0
    while n < transactions:
        try:
            if db is None or db.closed:
                db = psycopg.connect(url, connect_timeout=3)
            chosen = sorted(rng.sample(range(keys), 2))
            for i, key in enumerate(chosen):
                message_id = f"k{key}/{tag}-{n}-{i}"
                add(db, message_for(NAMES, {"n": n}, message_id=message_id), key=f"k{key}")
            time.sleep(rng.uniform(0, pause))  # hold the keys' locks a while
            db.commit()
            committed += 1
            n += 1
        except (OutboxError, psycopg.Error) as e:
            on_error(e)
            if db is not None:
                db.close()
            db = None
            time.sleep(0.2)
    if db is not None:
        db.close()
    return committed


@pytest.mark.timeout(120)
def test_relays_race_for_rows_and_every_key_stays_in_commit_order(topology: BrokerSettings) -> None:
    with temp_database() as url:
        OutboxStore(url).close()
        with relays(topology, url, 3, batch_rows=16) as racing:
            writers = [
                threading.Thread(target=write_keyed, args=(url, 120, 8, f"w{i}", print))
                for i in range(2)
            ]
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join(60)
            drained(url)
        expected = commit_order(url)
        got, duplicates = first_seen_order(topology)
        assert got == expected
        assert sum(len(v) for v in got.values()) == 480
        assert duplicates == 0  # leases kept the racers apart
        assert sum(1 for relay in racing if relay.sent) >= 2, [r.sent for r in racing]


@pytest.mark.timeout(150)
def test_a_postgresql_restart_under_the_relay_and_its_writers_loses_nothing(
    topology: BrokerSettings,
) -> None:
    try:
        find_bin_dir()
    except PgNodeError as e:
        pytest.skip(f"a PostgreSQL of the test's own is needed to restart it: {e}")
    with PgNode() as node:
        url = node.create_database("app")
        OutboxStore(url).close()
        errors: list[BaseException] = []
        with relays(topology, url, 2, batch_rows=20, lease=3.0):
            writer = threading.Thread(
                target=write_keyed, args=(url, 150, 5, "w", errors.append, 0.03)
            )
            writer.start()
            for _ in range(2):
                time.sleep(1.0)
                assert writer.is_alive()
                node.restart(down_for=1.0)
            writer.join(90)
            assert not writer.is_alive()
            drained(url, 90)
        expected = commit_order(url)
        got, _ = first_seen_order(topology)
        assert got == expected  # every committed row, per key in commit order
        # a COMMIT cut by a restart may have committed before the writer saw it fail: the
        # writer then runs that transaction again (on other keys), and both copies committed,
        # so both were published - published if and only if committed
        transactions = {mid.split("/")[1].rsplit("-", 1)[0] for v in got.values() for mid in v}
        assert transactions == {f"w-{n}" for n in range(150)}
        assert 300 <= sum(len(v) for v in got.values()) <= 300 + 2 * len(errors)
        assert errors, "the restarts did not reach the writers"


@pytest.mark.timeout(120)
def test_connections_cut_mid_publish_republish_with_the_same_ids_in_key_order(
    broker: TestBroker, topology: BrokerSettings
) -> None:
    host, port, _ = broker.endpoint()
    with FaultProxy((host, port)) as proxy, temp_database() as url:
        OutboxStore(url).close()
        with relays(through(topology, proxy.port), url, 1, batch_rows=50):
            writer = threading.Thread(target=write_keyed, args=(url, 200, 6, "w", print))
            writer.start()
            for _ in range(3):
                time.sleep(0.4)
                proxy.cut()
            writer.join(60)
            drained(url)
        got, _ = first_seen_order(topology)
        assert got == commit_order(url)
        assert sum(len(v) for v in got.values()) == 400


@pytest.mark.timeout(90)
def test_a_broker_that_refuses_connections_at_start_is_waited_for(
    broker: TestBroker, topology: BrokerSettings
) -> None:
    host, port, _ = broker.endpoint()
    with FaultProxy((host, port)) as proxy, temp_database() as url:
        OutboxStore(url).close()
        with psycopg.connect(url) as db:
            add(db, message_for(NAMES, {"n": 1}, message_id="k0/early"), key="k0")
            db.commit()
        proxy.refuse()
        with relays(through(topology, proxy.port), url, 1) as (relay,):
            time.sleep(3)
            assert relay.sent == 0
            proxy.accept()
            drained(url, 60)
        assert [p.message_id for _, p, _ in get_all(topology, "q:tasks")] == ["k0/early"]


@pytest.mark.timeout(120)
def test_a_memory_alarm_blocks_the_relay_which_publishes_once_it_clears(
    broker: TestBroker, topology: BrokerSettings
) -> None:
    blocked = BrokerSettings(
        topology.amqp_url, topology.management_url, blocked_connection_timeout=2
    )
    with temp_database() as url:
        OutboxStore(url).close()
        with relays(blocked, url, 1) as (relay,):
            with memory_alarm(broker):
                with psycopg.connect(url) as db:
                    for n in range(5):
                        add(db, message_for(NAMES, {"n": n}, message_id=f"k0/{n}"), key="k0")
                    db.commit()
                wait_for(lambda: relay.lost > 0, 30, 0.2, "a publish lost to the alarm")
                assert OutboxStore(url).status().pending == 5
            drained(url, 60)
        got, _ = first_seen_order(topology)
        assert got == {"k0": [f"k0/{n}" for n in range(5)]}


@pytest.mark.timeout(60)
def test_a_scheduled_row_cancelled_while_a_relay_holds_it_is_not_cancelled(
    topology: BrokerSettings,
) -> None:
    """The relay's lease and the cancel take the row's lock in turn: a cancel that comes
    while a relay publishes the row says ``in-flight`` and leaves it; once sent, ``sent``."""
    with temp_database() as url:
        store = OutboxStore(url)
        with psycopg.connect(url) as db:
            add(db, message_for(NAMES, {"n": 1}, message_id="k0/soon"), due_at=time.time() + 0.3)
            db.commit()
            time.sleep(0.4)
            lease = store.lease("relay-1", 30, 10, 10**6)
            assert [r.message_id for r in lease.rows.values()] == ["k0/soon"]
            assert cancel(db, "k0/soon") is CancelResult.IN_FLIGHT
            db.commit()
            store.release_all("relay-1")  # as a relay does when it stops before publishing
            with relays(topology, url, 1):
                drained(url)
            assert cancel(db, "k0/soon") is CancelResult.SENT
        store.close()
        assert [p.message_id for _, p, _ in get_all(topology, "q:tasks")] == ["k0/soon"]


@contextmanager
def table_locked(url: str) -> Iterator[None]:
    """The outbox table held ACCESS EXCLUSIVE, as a migration or an operator's ``LOCK TABLE``
    holds it, until the block ends."""
    with psycopg.connect(url) as db:
        db.execute("LOCK TABLE amqp_lab_outbox IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            db.rollback()


def add_rows(url: str, message_ids: list[str]) -> None:
    with psycopg.connect(url) as db:
        for message_id in message_ids:
            add(db, message_for(NAMES, {"n": 1}, message_id=message_id), key="k0")
        db.commit()


@pytest.mark.timeout(120)
def test_a_locked_outbox_table_is_an_outage_that_holds_up_no_stop(
    topology: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """While the table is locked the relay's statements give up after its ``lock_timeout``:
    an outage (one warning, backoff, no failure), and once the lock is gone the relay goes on.
    A stop while the table is locked ends within drain_timeout + 3 lock_timeout: before, the
    relay waited for the lock with no end (its stop held until the lock went)."""
    with temp_database() as url:
        OutboxStore(url).close()
        add_rows(url, [f"k0/{n}" for n in range(5)])
        with relays(topology, url, 1, lock_timeout=0.5, drain_timeout=1.0) as (relay,):
            drained(url)
            with caplog.at_level(logging.WARNING, "amqp_lab.outbox.relay"):
                with table_locked(url):
                    wait_for(
                        lambda: "database is unavailable" in caplog.text,
                        20,
                        0.1,
                        "the relay's statements giving up on the lock",
                    )
                    assert "lock timeout" in caplog.text  # PostgreSQL's lock_not_available
                add_rows(url, [f"k0/{n}" for n in range(5, 10)])
                drained(url, 30)
                assert "the outbox database is back" in caplog.text
            assert relay.failure is None
            with table_locked(url):
                started = time.monotonic()
                relay.stop()
                relay.join(20)
                stopping = time.monotonic() - started
                assert not relay.running, "the stop waited for the lock"
        # the drain (1 s), the leaser's wait (1 s) and a few statements of 0.5 s each
        assert stopping < 10, stopping
        got, duplicates = first_seen_order(topology)
        assert got == {"k0": [f"k0/{n}" for n in range(10)]}
        assert duplicates == 0
