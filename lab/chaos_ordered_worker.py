"""The ordered crash test's worker process (scripts/chaos.py --ordered --worker-process NAME):
an :class:`~amqp_lab.ordering.OrderedConsumer` on every shard of the ordered topology (single
active consumer: one worker per shard active, the others standby), the ledger handler, and a
transient failure on the first try of every message whose seq matches ``fail_every``.

The first-try failures are decided through a small ``faults`` table in a SQLite file of the
run's own, in a transaction of its own committed before the handler raises: the dedup store's
transaction rolls back on the error (and on SQLite holds the write lock, so a second
connection to the same file would wait for it), while the fault mark must survive the
rollback, a SIGKILL and a takeover, so that the retry (in-worker, or by the next active
worker) succeeds.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.dedup import open_store
from amqp_lab.errors import TransientError
from amqp_lab.message import Task
from amqp_lab.ordering import OrderedConfig, OrderedConsumer
from amqp_lab.retry.policy import RetryPolicy
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import load_topology
from amqp_lab.topology.ordered import with_ordered
from lab.chaos import ledger_handler
from lab.chaos_ordered import fails_first_try

CHAOS_RETRY = RetryPolicy("backoff", max_attempts=5, base=0.05, cap=0.5)
IDLE_EXIT = 1.0  # seconds without a delivery, after the stop file appeared, before exiting
FAULTS_DDL = "CREATE TABLE IF NOT EXISTS faults (message_id TEXT PRIMARY KEY, at REAL NOT NULL)"


class FirstTryFaults:
    """The ``faults`` table in the SQLite file ``path``: :meth:`first_time` is true once per
    message_id, across processes (autocommit: each INSERT is its own transaction). Used from
    the consumer's one handler thread, not the thread that opened it (check_same_thread off)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self.db.execute(FAULTS_DDL)

    def first_time(self, message_id: str) -> bool:
        """Mark ``message_id`` failed; True when it was not marked before."""
        cursor = self.db.execute(
            "INSERT OR IGNORE INTO faults (message_id, at) VALUES (?, ?)", (message_id, time.time())
        )
        return cursor.rowcount == 1

    def count(self) -> int:
        """Failures injected so far."""
        return int(self.db.execute("SELECT count(*) FROM faults").fetchone()[0])

    def close(self) -> None:
        self.db.close()


def ordered_handler(
    run_id: str, worker: str, faults: FirstTryFaults, fail_every: int, work_seconds: float
) -> Callable[[Task, Any], None]:
    """The ledger handler (lab.chaos), raising TransientError on the first try of every message
    whose body seq matches ``fail_every`` (lab.chaos_ordered.fails_first_try)."""
    apply = ledger_handler(run_id, worker, work_seconds)

    def handle(task: Task, db: Any) -> None:
        seq = int(task.body["seq"])
        if fails_first_try(seq, fail_every) and faults.first_time(task.message_id):
            raise TransientError(f"{task.message_id}: injected first-try failure")
        apply(task, db)

    return handle


def report(r: DeliveryReport) -> None:
    """One output line per report (lab.chaos.OutputTally), ``at``: now, epoch seconds."""
    print(json.dumps(r.as_dict() | {"at": time.time(), "started": None}), flush=True)


def run_ordered_worker(
    settings: BrokerSettings,
    dedup_url: str,
    faults_path: Path,
    run_id: str,
    name: str,
    stop_file: Path,
    shards: int,
    fail_every: int = 7,
    work_seconds: float = 0.0,
) -> int:
    """Consume every shard until the stop file appears (no idle exit before: a standby stays
    subscribed), then until idle for IDLE_EXIT seconds; return the exit code (0)."""
    names = with_ordered(load_topology(), shards=shards).names
    store = open_store(dedup_url)
    faults = FirstTryFaults(faults_path)
    handler = ordered_handler(run_id, name, faults, fail_every, work_seconds)
    config = OrderedConfig(names, retry=CHAOS_RETRY, reconnect_attempts=30)
    try:
        consumer = OrderedConsumer(settings, handler, store, config, on_report=report)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.1):
                if stop_file.exists():
                    consumer.stop("the stop file appeared")
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        consumer.run()
        done.set()
        idle = OrderedConfig(names, retry=CHAOS_RETRY, idle_exit=IDLE_EXIT, reconnect_attempts=30)
        OrderedConsumer(settings, handler, store, idle, on_report=report).run()
        return 0
    finally:
        faults.close()
        store.close()
