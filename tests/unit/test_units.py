"""The plain consumer's units: when a partial batch starts (group commit), and the SQLite
store's in-process write lock that lets several handler threads take turns without SQLite's
sleeping busy handler."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.consuming.units import InFlight, start_now
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.errors import DedupStoreError, StoreUnavailable

pytestmark = pytest.mark.unit


class Channel:
    """What start_now reads of a BlockingChannel: the deliveries pika holds."""

    def __init__(self, waiting: int) -> None:
        self.waiting = waiting

    def get_waiting_message_count(self) -> int:
        return self.waiting


def unit(done: bool | None) -> InFlight:
    """A unit whose store work is done, running, or absent (None: nothing to run)."""
    if done is None:
        return ([], None)
    future: Future[None] = Future()
    if done:
        future.set_result(None)
    return ([], future)


@pytest.mark.parametrize(
    ("waiting", "units", "expected"),
    [
        (0, [], True),  # a quiet queue: the delivery starts when it arrives
        (0, [unit(True), unit(None)], True),  # units finished (not settled yet): no wait
        (0, [unit(True), unit(False)], False),  # one commits: collect meanwhile (group commit)
        (0, [unit(False)], False),
        (3, [], False),  # pika holds more: they join this batch first
        (1, [unit(True)], False),
    ],
)
def test_a_partial_batch_starts_at_once_only_when_nothing_more_is_held_and_no_unit_runs(
    waiting: int, units: list[InFlight], expected: bool
) -> None:
    assert start_now(Channel(waiting), units) is expected


def test_threads_take_turns_on_the_write_lock_and_the_next_wakes_at_once(tmp_path: Path) -> None:
    """A second thread's batch waits for the first's commit on the Python lock and begins as
    soon as it is released - not after SQLite's busy handler's next sleep (up to 100 ms)."""
    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    inside, release = threading.Event(), threading.Event()
    begun: dict[str, float] = {}

    def hold(db: Any) -> None:
        db.execute("SELECT 1")  # the first use opens the transaction
        inside.set()
        release.wait(5)

    def note(db: Any) -> None:
        begun["second"] = time.monotonic()

    first = threading.Thread(target=lambda: store.process_batch([("a", hold), ("b", hold)]))
    first.start()
    assert inside.wait(5)
    second = threading.Thread(target=lambda: store.process_batch([("c", note), ("d", note)]))
    second.start()
    time.sleep(0.3)  # the second is blocked behind the first's transaction meanwhile
    assert "second" not in begun
    released = time.monotonic()
    release.set()
    first.join(5)
    second.join(5)
    assert begun["second"] - released < 0.05
    assert all(store.is_processed(m) for m in "abcd")
    store.close()


def test_the_write_lock_is_released_when_a_handler_ends_the_transaction_itself(
    tmp_path: Path,
) -> None:
    """A handler's COMMIT as SQL fails its batch (DedupStoreError); the store stays usable
    from any thread: the lock went with the transaction."""
    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    with pytest.raises(DedupStoreError):
        store.process_batch([("a", lambda db: db.execute("COMMIT")), ("b", lambda db: None)])
    done = threading.Event()

    def other() -> None:
        store.process_batch([("c", lambda db: None), ("d", lambda db: None)])
        done.set()

    threading.Thread(target=other, daemon=True).start()
    assert done.wait(5), "another thread could not begin: the write lock was kept"
    assert store.is_processed("c")
    store.close()


def test_a_writer_held_past_busy_timeout_is_store_unavailable_not_a_hang(tmp_path: Path) -> None:
    """A handler thread that keeps the batch's transaction open past busy_timeout makes the
    next thread's begin fail with StoreUnavailable (retried as an outage), as SQLite's
    "database is locked" did before the in-process lock - never a wait without end."""
    store = SqliteDedupStore(tmp_path / "d.sqlite3", busy_timeout=0.3)
    inside, release = threading.Event(), threading.Event()

    def hold(db: Any) -> None:
        db.execute("SELECT 1")
        inside.set()
        release.wait(5)

    first = threading.Thread(target=lambda: store.process_batch([("a", hold), ("b", hold)]))
    first.start()
    assert inside.wait(5)
    with pytest.raises(StoreUnavailable, match="held the write lock"):
        store.process_batch([("c", lambda db: None), ("d", lambda db: None)])
    release.set()
    first.join(5)
    assert store.is_processed("a") and not store.is_processed("c")
    store.close()


@pytest.mark.timeout(10)
def test_pumping_until_one_of_no_futures_is_done_returns_at_once(tmp_path: Path) -> None:
    """An empty list is nothing to wait for: the pump must not loop on it for ever (the
    connection is not even touched)."""
    from amqp_lab.consuming.config import ConsumerConfig
    from amqp_lab.consuming.engine import ConsumerEngine, EngineConfig
    from amqp_lab.consuming.observer import NO_OBSERVER
    from amqp_lab.settings import BrokerSettings
    from amqp_lab.topology import Names

    names = Names(exchange="", routing_key="q", queue="q", dead_letter_exchange="", dlq="")
    config = ConsumerConfig(names, verify_topology=False)
    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    engine = ConsumerEngine(
        BrokerSettings("amqp://guest:guest@127.0.0.1/%2F"),
        store,
        EngineConfig(dlx="", expectations=config.retry_expectations("/"), verify_topology=False),
        NO_OBSERVER,
    )
    try:
        engine.pump_until_done(None, [])
    finally:
        store.close()
