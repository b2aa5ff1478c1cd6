"""PostgreSQL dropping off the network under a worker's dedup store and a relay: no FIN, no RST,
no answer (iptables drops the packets of a server of the test's own). Without TCP keepalives
and ``tcp_user_timeout`` every one of these calls hung for at least as long as the test (the
kernel gives up on unacknowledged data after about 15 minutes, and on a request already
received never: psycopg2#561, #1017). With them (:mod:`amqp_lab.dedup.keepalive`) each call
fails as an outage within the keepalive's bound, nothing half-done is committed, and once the
network is back the store and the relay carry on and lose nothing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from amqp_lab.dedup import PostgresDedupStore
from amqp_lab.dedup.keepalive import PgKeepalive
from amqp_lab.errors import OutboxUnavailable, StoreUnavailable
from amqp_lab.message import message_for
from amqp_lab.outbox import add
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings
from lab.pg_node import PgNode, PgNodeError, find_bin_dir
from tests.blackhole import blackhole, unavailable
from tests.integration.test_outbox_faults import commit_order, drained, first_seen_order, relays
from tests.support import NAMES, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.failure_model,
    pytest.mark.no_plain_consumer,
]

FAST = PgKeepalive(idle=1, interval=1, count=2, user_timeout=3)
"""A dead link found within about 3 s (the default takes about 30)."""
BOUND = FAST.dead_after + 7  # the keepalive's bound, with room for a loaded machine


@pytest.fixture
def node() -> Iterator[PgNode]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"a network that is gone is made with iptables: {why}")
    try:
        find_bin_dir()
    except PgNodeError as e:
        pytest.skip(f"a PostgreSQL of the test's own is needed, to cut it off: {e}")
    with PgNode() as started:
        yield started


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``call`` on a thread of its own; the dict gets ``result`` or ``error``."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = call()
        except BaseException as e:  # the outcome under test
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def recovered(call: Callable[[], bool]) -> bool:
    """``call()``, or False while it raises an outage (the store not back yet)."""
    try:
        return call()
    except (StoreUnavailable, OutboxUnavailable):
        return False


def processed(url: str) -> set[str]:
    with psycopg.connect(url) as db:
        return {row[0] for row in db.execute("SELECT message_id FROM processed").fetchall()}


@pytest.mark.timeout(90)
def test_a_dedup_call_whose_answer_never_comes_fails_as_an_outage(node: PgNode) -> None:
    """The handler's statement reached the server, then the network went: the connection is
    idle, waiting, and only the probes can tell. The delivery's claim and writes are not
    committed; once the network is back the same message_id runs again."""
    url = node.create_database("app")
    store = PostgresDedupStore(url, connect_timeout=2, keepalive=FAST)
    try:
        assert store.process_once("m-0", lambda db: None)
        thread, out = in_thread(
            lambda: store.process_once("m-1", lambda db: db.execute("SELECT pg_sleep(1)"))
        )
        time.sleep(0.3)  # the statement is at the server
        with blackhole(node.port):
            started = time.monotonic()
            thread.join(BOUND)
            assert not thread.is_alive(), f"the call still hangs after {BOUND} s"
            assert isinstance(out.get("error"), StoreUnavailable), out
            assert time.monotonic() - started < BOUND
        assert processed(url) == {"m-0"}  # nothing of m-1 committed
        ran: list[str] = []
        # this thread's connection idled through the cut: its probes went unanswered and the
        # kernel dropped it, so its next call fails too (an outage, as after a restart), and
        # the one after that reconnects
        wait_for(
            lambda: recovered(lambda: store.process_once("m-1", lambda db: ran.append("m-1"))),
            30,
            0.5,
            "the store back",
        )
        assert ran == ["m-1"] and processed(url) == {"m-0", "m-1"}
    finally:
        store.close()


@pytest.mark.timeout(90)
def test_an_outbox_call_sent_into_a_dead_network_fails_as_an_outage(node: PgNode) -> None:
    """The request itself is never acknowledged: ``tcp_user_timeout`` ends it (the kernel would
    retransmit for about 15 minutes). Then the store reconnects on its next call."""
    url = node.create_database("app")
    store = OutboxStore(url, connect_timeout=2, keepalive=FAST)
    try:
        assert store.status().pending == 0
        with blackhole(node.port):
            thread, out = in_thread(store.status)
            thread.join(BOUND)
            assert not thread.is_alive(), f"the call still hangs after {BOUND} s"
            assert isinstance(out.get("error"), OutboxUnavailable), out
        wait_for(lambda: recovered(lambda: store.status().pending == 0), 30, 0.5, "the store back")
    finally:
        store.close()


@pytest.mark.timeout(180)
def test_a_relay_whose_database_drops_off_the_network_carries_on_once_it_is_back(
    node: PgNode, topology: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay running when its database's network goes: its loop's, its leaser's and its
    LISTEN connection all find out (one outage warning, the listener lost), and once the
    network is back it relays what was committed before and after, per key in commit order."""
    url = node.create_database("app")
    OutboxStore(url).close()

    def write(tag: str, n: int) -> None:
        with psycopg.connect(url) as db:
            for i in range(n):
                key = f"k{i % 3}"
                add(db, message_for(NAMES, {"n": i}, message_id=f"{key}/{tag}-{i}"), key=key)
            db.commit()

    with caplog.at_level(logging.WARNING, "amqp_lab.outbox"):
        with relays(topology, url, 1, keepalive=FAST, poll=0.2) as (relay,):
            write("before", 12)
            drained(url)
            with blackhole(node.port):
                wait_for(
                    lambda: "database is unavailable" in caplog.text,
                    BOUND + 5,
                    0.2,
                    "the relay's outage warning",
                )
                wait_for(
                    lambda: "LISTEN amqp_lab_outbox lost" in caplog.text,
                    BOUND + 5,
                    0.2,
                    "the listener's connection found dead",
                )
            write("after", 12)
            drained(url, 90)
            wait_for(lambda: "database is back" in caplog.text, 30, 0.2, "the relay's recovery")
        assert relay.failure is None
    got, _ = first_seen_order(topology)
    assert got == commit_order(url)
    assert sum(len(v) for v in got.values()) == 24
