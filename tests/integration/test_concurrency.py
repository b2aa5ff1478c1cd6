"""--concurrency N: up to N handlers at once in one worker, with every guarantee kept - the
dedup claim, ack only after commit, settlement on the delivering channel, redelivery after a
lost connection, the drain on SIGTERM - on SQLite and PostgreSQL; and the SQLite store holds
no write lock across a handler's work outside the database, so several processes scale."""

from __future__ import annotations

import dataclasses
import json
import signal
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.consuming.consumer import Consumer, ConsumerConfig, DeliveryReport
from amqp_lab.dedup import ManagedDedupStore, SqliteDedupStore, open_store
from amqp_lab.errors import TransientError
from amqp_lab.management import ManagementClient
from amqp_lab.message import Task
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message
from tests.pgsupport import temp_database
from tests.support import (
    NAMES,
    consumer_count,
    get_all,
    publish,
    ready_count,
    start_script,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]


class Overlap:
    """Counts handlers running at once (``peak``) and records each handler's message_id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.calls: list[str] = []

    def __enter__(self) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.running -= 1


def slow_writer(overlap: Overlap, seconds: float) -> Callable[[Task, Any], None]:
    """A handler that waits ``seconds`` (an external call, outside the database), then writes
    one row in the dedup transaction."""

    def handle(task: Task, db: Any) -> None:
        with overlap:
            overlap.calls.append(task.message_id)
            time.sleep(seconds)
        db.execute("INSERT INTO rows_written VALUES (?)", (task.message_id,))

    return handle


def rows_written(store: ManagedDedupStore) -> list[str]:
    rows = store.run_in_transaction(
        lambda db: db.execute("SELECT message_id FROM rows_written").fetchall()
    )
    return sorted(str(r[0]) for r in rows)


def publish_slow(settings: BrokerSettings, count: int, seconds: float) -> None:
    """``count`` lab ``slow`` tasks m-0.. whose handler sleeps ``seconds`` before its write."""
    with Publisher(settings) as publisher:
        for i in range(count):
            message = task_message("slow", i, f"m-{i}")
            body = {**json.loads(message.body), "seconds": seconds}
            publisher.publish(dataclasses.replace(message, body=json.dumps(body).encode()))


def create_rows_table(store: ManagedDedupStore) -> ManagedDedupStore:
    """The handlers' table, created before they run: on PostgreSQL two transactions running
    CREATE TABLE IF NOT EXISTS at once can collide (a unique violation in pg_type), so with
    concurrency an application creates its tables first (a migration), as here."""
    store.run_in_transaction(
        lambda db: db.execute("CREATE TABLE IF NOT EXISTS rows_written (message_id TEXT)")
    )
    return store


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ManagedDedupStore]:
    if request.param == "sqlite":
        opened: ManagedDedupStore = SqliteDedupStore(tmp_path / "d.sqlite3")
        try:
            yield create_rows_table(opened)
        finally:
            opened.close()
        return
    with temp_database() as url:
        opened = open_store(url)
        try:
            yield create_rows_table(opened)
        finally:
            opened.close()


@pytest.mark.timeout(90)
def test_n_handlers_run_at_once_and_each_message_is_applied_once(
    topology: BrokerSettings, store: ManagedDedupStore
) -> None:
    ids = [f"m-{i}" for i in range(8)]
    publish(topology, *[("ok", m) for m in ids], ("ok", "m-0"))  # m-0 twice: one duplicate
    overlap = Overlap()
    reports: list[DeliveryReport] = []
    config = ConsumerConfig(NAMES, prefetch=8, concurrency=4, idle_exit=1.0)
    started = time.monotonic()
    handled = Consumer(topology, slow_writer(overlap, 0.5), store, config, reports.append).run()
    elapsed = time.monotonic() - started
    assert handled == 9
    assert overlap.peak == 4  # never more than N, and N reached
    assert elapsed < 8 * 0.5  # one at a time would take 4.5 s of handler time alone
    assert rows_written(store) == ids
    outcomes = Counter((r.message_id, r.outcome) for r in reports)
    assert outcomes == Counter({**{(m, "processed"): 1 for m in ids}, ("m-0", "duplicate"): 1})
    assert ready_count(topology, "q:tasks") == 0


@pytest.mark.timeout(90)
def test_the_same_message_id_in_two_handlers_at_once_is_applied_once(
    topology: BrokerSettings, store: ManagedDedupStore
) -> None:
    """Two copies of one message_id start together on two handler threads: the claim lets one
    apply it; the other waits for that commit and is a duplicate (never two rows)."""
    publish(topology, ("ok", "m-same"), ("ok", "m-same"))
    overlap = Overlap()
    reports: list[DeliveryReport] = []
    config = ConsumerConfig(NAMES, prefetch=2, concurrency=2, idle_exit=1.0)
    Consumer(topology, slow_writer(overlap, 0.3), store, config, reports.append).run()
    assert sorted(r.outcome for r in reports) == ["duplicate", "processed"]
    assert rows_written(store) == ["m-same"]


@pytest.mark.timeout(90)
def test_failures_among_concurrent_successes_settle_one_by_one(
    topology: BrokerSettings, store: ManagedDedupStore
) -> None:
    """Successes are acked individually (no ack multiple that could cover a delivery still in
    another handler); a transient failure is requeued and processed on its redelivery, a bug
    is requeued once and then goes to the DLQ."""
    publish(topology, ("ok", "a"), ("flaky", "f"), ("ok", "b"), ("bad", "x"), ("ok", "c"))
    attempts: Counter[str] = Counter()

    def handle(task: Task, db: Any) -> None:
        attempts[task.message_id] += 1
        time.sleep(0.2)
        if task.message_id == "f" and task.attempt == 1:
            raise TransientError("upstream 503")
        if task.message_id == "x":
            raise RuntimeError("bug")
        db.execute("INSERT INTO rows_written VALUES (?)", (task.message_id,))

    reports: list[DeliveryReport] = []
    config = ConsumerConfig(NAMES, prefetch=10, ack_batch=1, concurrency=4, idle_exit=1.0)
    Consumer(topology, handle, store, config, reports.append).run()
    assert sorted((r.message_id, r.outcome, r.attempts) for r in reports) == [
        ("a", "processed", 1),
        ("b", "processed", 1),
        ("c", "processed", 1),
        ("f", "processed", 2),
        ("f", "requeued", 1),
        ("x", "dead-lettered", 2),  # an unknown error: requeued once, then the DLQ
        ("x", "requeued", 1),
    ]
    assert rows_written(store) == ["a", "b", "c", "f"]
    assert (ready_count(topology, "q:tasks"), ready_count(topology, "q:tasks:dlq")) == (0, 1)


@pytest.mark.timeout(90)
def test_batches_on_concurrent_handlers_commit_and_ack_each_batch_once(
    topology: BrokerSettings, store: ManagedDedupStore
) -> None:
    ids = [f"m-{i:02d}" for i in range(24)]
    publish(topology, *[("ok", m) for m in ids])
    overlap = Overlap()
    reports: list[DeliveryReport] = []
    config = ConsumerConfig(NAMES, prefetch=12, ack_batch=3, concurrency=3, idle_exit=1.0)
    Consumer(topology, slow_writer(overlap, 0.05), store, config, reports.append).run()
    assert sorted(r.message_id or "" for r in reports) == ids
    assert {r.outcome for r in reports} == {"processed"}
    assert rows_written(store) == ids
    assert ready_count(topology, "q:tasks") == 0


@pytest.mark.timeout(120)
def test_a_connection_lost_with_n_handlers_in_flight_applies_each_once(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """The connection is force-closed while 4 handlers run: they all commit, none of their
    acks can be sent (another channel cannot settle them), the broker redelivers all 4 and
    dedup turns each into a duplicate - 4 rows, no row twice."""
    publish(topology, *[("ok", f"m-{i}") for i in range(4)])
    name = f"consumer-{uuid.uuid4().hex[:8]}"
    settings = BrokerSettings(topology.amqp_url, topology.management_url, connection_name=name)
    release = threading.Event()
    overlap = Overlap()

    def handle(task: Task, db: Any) -> None:
        with overlap:
            overlap.calls.append(task.message_id)
            if not task.redelivered:
                release.wait(30)
        db.execute("CREATE TABLE IF NOT EXISTS rows_written (message_id TEXT)")
        db.execute("INSERT INTO rows_written VALUES (?)", (task.message_id,))

    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    reports: list[DeliveryReport] = []
    config = ConsumerConfig(NAMES, prefetch=4, concurrency=4, idle_exit=1.5)
    consumer = Consumer(settings, handle, store, config, reports.append)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    wait_for(lambda: overlap.running == 4, what="4 handlers running")
    with ManagementClient(topology) as api:
        (conn,) = wait_for(
            lambda: [
                c
                for c in api.connections(topology.vhost)
                if c.get("client_properties", {}).get("connection_name") == name
            ],
            what="consumer connection listed",
        )
        api.close_connection(conn["name"], "test: lost with handlers in flight")
    release.set()
    thread.join(60)
    assert not thread.is_alive()
    assert sorted(overlap.calls) == [f"m-{i}" for i in range(4)]  # each handler ran once
    assert sorted((r.message_id, r.outcome) for r in reports) == [
        (f"m-{i}", "duplicate") for i in range(4)
    ]
    assert rows_written(store) == [f"m-{i}" for i in range(4)]
    assert ready_count(topology, "q:tasks") == 0
    store.close()


@pytest.mark.timeout(90)
def test_sigterm_drains_every_handler_in_flight_then_exits_0(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """worker.py --concurrency 3: SIGTERM while 3 slow handlers run lets all 3 finish and be
    acked; what was prefetched but not started goes back to the queue."""
    publish_slow(topology, 6, seconds=2)
    worker = start_script(
        topology,
        "worker.py",
        "--concurrency",
        "3",
        "--prefetch",
        "6",
        "--dedup-path",
        str(tmp_path / "d.sqlite3"),
    )
    wait_for(lambda: ready_count(topology, "q:tasks") == 0, what="all 6 prefetched")
    time.sleep(0.5)  # the first three handlers are under way (each takes 2 s)
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    done = [line.split()[0] for line in out.splitlines() if "outcome=processed" in line]
    assert sorted(done) == ["message_id=m-0", "message_id=m-1", "message_id=m-2"]
    assert wait_for(lambda: ready_count(topology, "q:tasks") == 3, what="3 back in the queue")
    with sqlite3.connect(tmp_path / "d.sqlite3") as db:
        assert sorted(r[0] for r in db.execute("SELECT message_id FROM effects")) == [
            "m-0",
            "m-1",
            "m-2",
        ]


@pytest.mark.timeout(120)
def test_processes_sharing_one_sqlite_file_run_their_slow_handlers_at_once(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Two worker processes, one SQLite file: a handler waiting on an external call holds no
    write lock, so the two processes' handlers run at the same time - their recorded runs
    overlap (with the write lock taken before the handler, they could only take turns)."""
    path = str(tmp_path / "shared.sqlite3")
    workers = [
        start_script(
            topology,
            "worker.py",
            "--handler",
            "tests.worker_handlers:timed_sleep",
            "--prefetch",
            "1",
            "--idle-exit",
            "8",  # the first must still be there when the second subscribes on a loaded machine
            "--dedup-path",
            path,
        )
        for _ in range(2)
    ]
    wait_for(lambda: consumer_count(topology, "q:tasks") == 2, 60, what="both workers subscribed")
    with Publisher(topology) as publisher:
        for i in range(4):
            body = json.dumps({"seconds": 1.0}).encode()
            publisher.publish(dataclasses.replace(task_message("ok", i, f"m-{i}"), body=body))
    outputs = [w.communicate(timeout=60) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [e for _, e in outputs]
    with sqlite3.connect(path) as db:
        runs = db.execute("SELECT message_id, pid, started, ended FROM handler_runs").fetchall()
    assert sorted(r[0] for r in runs) == [f"m-{i}" for i in range(4)]  # each applied once
    assert len({r[1] for r in runs}) == 2  # both processes took part
    overlapping = [
        (a[0], b[0])
        for a in runs
        for b in runs
        if a[1] < b[1] and a[2] < b[3] and b[2] < a[3]  # two processes, intervals overlap
    ]
    assert overlapping, runs


@pytest.mark.timeout(180)
def test_a_message_that_kills_the_worker_does_not_make_its_neighbours_poison(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """--concurrency 4: a crash task kills the worker while two slow innocent tasks run beside
    it. On every restart a redelivered delivery runs alone, so the redelivery count past
    --max-redeliveries makes only the crash task poison; the innocent ones are processed."""
    publish(topology, ("crash", "m-crash"))
    publish_slow(topology, 2, seconds=1.0)  # m-0, m-1
    path = str(tmp_path / "d.sqlite3")
    codes: list[int] = []
    lines: list[str] = []
    while not codes or codes[-1] != 0:
        assert len(codes) < 8, f"crash loop: exit codes {codes}"
        proc = start_script(
            topology, "worker.py", "--concurrency", "4", "--max-redeliveries", "2",
            "--idle-exit", "1.5", "--dedup-path", path,
        )  # fmt: skip
        out, _ = proc.communicate(timeout=60)
        codes.append(proc.returncode)
        lines += [line for line in out.splitlines() if "outcome=" in line]
    final = {line.split()[0]: line.split()[1] for line in lines}
    assert final == {
        "message_id=m-crash": "outcome=dead-lettered",
        "message_id=m-0": "outcome=processed",
        "message_id=m-1": "outcome=processed",
    }
    ((_, _, body),) = get_all(topology, "q:tasks:dlq")
    assert json.loads(body)["message_id"] == "m-crash"
    assert json.loads(body)["error"]["type"] == "PoisonMessage"
    with sqlite3.connect(path) as db:
        assert sorted(r[0] for r in db.execute("SELECT message_id FROM effects")) == [
            "m-0",
            "m-1",
        ]
