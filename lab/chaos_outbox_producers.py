"""The outbox crash test's producers: threads committing business rows with outbox messages,
rolling some back, scheduling some, cancelling some of those; and the truth read back.

Each transaction inserts an ``orders`` row and adds its message to the outbox with the same
key, holds its locks a few milliseconds (so writers of one key overlap), then commits or rolls
back. A transaction that fails (the database restarting) is retried with the same message_id,
unless its order is found committed: a COMMIT whose answer was lost may have landed. What
committed is read from the database at the end, never assumed: ``orders`` in commit order and
``cancels`` (a cancel and its record commit together).
"""

from __future__ import annotations

import contextlib
import queue
import random
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from amqp_lab.errors import OutboxError
from amqp_lab.message import message_for
from amqp_lab.outbox import CancelResult, add, cancel
from amqp_lab.topology.model import Names
from lab.chaos_outbox import Committed

__all__ = ["ORDERS_DDL", "Producers", "Txn", "plan_transactions", "read_committed"]

ORDERS_DDL = {
    "sqlite": (
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY AUTOINCREMENT, "
        "message_id TEXT NOT NULL UNIQUE, key TEXT NOT NULL, due_at REAL)",
        "CREATE TABLE IF NOT EXISTS cancels (message_id TEXT PRIMARY KEY, result TEXT NOT NULL)",
    ),
    "postgresql": (
        "CREATE TABLE IF NOT EXISTS orders (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " message_id TEXT NOT NULL UNIQUE, key TEXT NOT NULL, due_at DOUBLE PRECISION)",
        "CREATE TABLE IF NOT EXISTS cancels (message_id TEXT PRIMARY KEY, result TEXT NOT NULL)",
    ),
}


@dataclass(frozen=True)
class Txn:
    """One planned transaction: ``n`` (also its message_id ``order-<n>``), its ``key``,
    ``rollback``, ``delay`` (scheduled: seconds after its commit, 0: at once), ``cancel``."""

    n: int
    key: str
    rollback: bool = False
    delay: float = 0.0
    cancel: bool = False

    @property
    def message_id(self) -> str:
        return f"order-{self.n:05d}"


def plan_transactions(
    count: int, keys: int, rng: random.Random, rollback_every: int = 8, schedule_every: int = 5
) -> list[Txn]:
    """``count`` transactions over ``keys`` keys: every ``rollback_every``-th rolls back, every
    ``schedule_every``-th is scheduled 0.5-2 s ahead and every other scheduled one is
    cancelled."""
    plan = []
    for n in range(1, count + 1):
        scheduled = schedule_every > 0 and n % schedule_every == 0
        plan.append(
            Txn(
                n,
                f"key-{rng.randrange(keys):02d}",
                rollback=rollback_every > 0 and n % rollback_every == 0,
                delay=rng.uniform(0.5, 2.0) if scheduled else 0.0,
                cancel=scheduled and n % (2 * schedule_every) == 0,
            )
        )
    return plan


def connect(url: str) -> Any:
    if url.startswith("postgresql://"):
        return psycopg.connect(url, connect_timeout=3)
    db = sqlite3.connect(url, timeout=30, isolation_level=None)
    return db


def begin(db: Any) -> None:
    if isinstance(db, sqlite3.Connection):
        db.execute("BEGIN IMMEDIATE")


def commit(db: Any) -> None:
    db.execute("COMMIT") if isinstance(db, sqlite3.Connection) else db.commit()


def rollback(db: Any) -> None:
    if db is None:
        return
    with contextlib.suppress(sqlite3.Error, psycopg.Error):
        db.execute("ROLLBACK") if isinstance(db, sqlite3.Connection) else db.rollback()


def q(db: Any, sql: str) -> str:
    return sql if isinstance(db, sqlite3.Connection) else sql.replace("?", "%s")


class Producers:
    """``threads`` producer threads over ``plan`` into the outbox at ``url``, the messages
    addressed to ``names`` (stage A's ordered topology, keyed), at most ``rate`` transactions
    a second. ``rolled_back``: the message_ids of transactions rolled back on purpose;
    ``errors``: failures retried."""

    def __init__(
        self, url: str, names: Names, plan: list[Txn], threads: int, seed: int, rate: float = 0.0
    ) -> None:
        self.url, self.names, self.plan, self.rate = url, names, plan, rate
        self._started = 0.0
        self.rolled_back: set[str] = set()
        self.cancel_results: dict[str, str] = {}
        self.errors = 0
        self.done = 0
        self.crashed: list[str] = []  # a producer thread's unexpected exception
        self.lock_waits = 0  # adds that waited for another transaction of their key
        self._work: queue.Queue[Txn] = queue.Queue()
        for txn in plan:
            self._work.put(txn)
        self._threads = [
            threading.Thread(target=self._run, args=(random.Random(seed + i),), daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        """Start the threads; transaction n begins no earlier than n / ``rate`` seconds from
        now (0: no pacing)."""
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()

    def alive(self) -> bool:
        """Whether a producer thread still runs."""
        return any(t.is_alive() for t in self._threads)

    def join(self, timeout: float) -> bool:
        """Wait for every transaction; whether they all finished."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _run(self, rng: random.Random) -> None:
        try:
            self._produce(rng)
        except BaseException as e:  # the run must fail, not drain a partial plan quietly
            self.crashed.append(f"{type(e).__name__}: {e}")
            raise

    def _produce(self, rng: random.Random) -> None:
        db: Any = None
        while True:
            try:
                txn = self._work.get_nowait()
            except queue.Empty:
                break
            if self.rate > 0:
                time.sleep(max(0.0, self._started + txn.n / self.rate - time.monotonic()))
            while True:
                try:
                    db = db or connect(self.url)
                    self._transaction(db, txn, rng)
                    break
                except (OutboxError, psycopg.Error, sqlite3.Error):
                    self.errors += 1
                    rollback(db)
                    if db is not None:
                        db.close()
                    db = None
                    time.sleep(rng.uniform(0.1, 0.4))
            self.done += 1
        if db is not None:
            db.close()

    def _transaction(self, db: Any, txn: Txn, rng: random.Random) -> None:
        if txn.message_id in self.rolled_back:
            return
        found = db.execute(q(db, "SELECT 1 FROM orders WHERE message_id = ?"), (txn.message_id,))
        if found.fetchone() is not None:  # an earlier COMMIT landed after all
            rollback(db)
            self._maybe_cancel(db, txn, rng)
            return
        rollback(db)
        begin(db)
        due = time.time() + txn.delay if txn.delay else None
        db.execute(
            q(db, "INSERT INTO orders (message_id, key, due_at) VALUES (?, ?, ?)"),
            (txn.message_id, txn.key, due),
        )
        body = {"key": txn.key, "n": txn.n, "due_at": due}
        message = message_for(self.names, body, message_id=txn.message_id, key=txn.key)
        before = time.monotonic()
        add(db, message, due_at=due)
        if time.monotonic() - before > 0.002:
            self.lock_waits += 1
        time.sleep(rng.uniform(0, 0.005))  # hold the key's lock while another writer waits
        if txn.rollback:
            rollback(db)
            self.rolled_back.add(txn.message_id)
            return
        commit(db)
        self._maybe_cancel(db, txn, rng)

    def _maybe_cancel(self, db: Any, txn: Txn, rng: random.Random) -> None:
        if not txn.cancel or txn.message_id in self.cancel_results:
            return
        time.sleep(rng.uniform(0.0, 0.3))
        begin(db)
        result = cancel(db, txn.message_id)
        if result in (CancelResult.CANCELLED, CancelResult.CANCELLED_AFTER_TRY):
            db.execute(
                q(db, "INSERT INTO cancels (message_id, result) VALUES (?, ?)"),
                (txn.message_id, "yes" if result is CancelResult.CANCELLED else "maybe"),
            )
        commit(db)
        self.cancel_results[txn.message_id] = result.value


def read_committed(url: str) -> list[Committed]:
    """The committed orders in commit order (PostgreSQL: their transactions' commit
    timestamps, track_commit_timestamp on; SQLite: rowid, its one writer's order) with their
    committed cancels."""
    db = connect(url)
    try:
        if isinstance(db, sqlite3.Connection):
            order = "o.id"
        else:
            order = "pg_xact_commit_timestamp(o.xmin), o.id"
        rows = db.execute(
            "SELECT o.message_id, o.key, o.due_at, coalesce(c.result, 'no') FROM orders o "
            f"LEFT JOIN cancels c ON c.message_id = o.message_id ORDER BY {order}"
        ).fetchall()
    finally:
        db.close()
    return [
        Committed(str(m), str(k), None if d is None else float(d), str(c)) for m, k, d, c in rows
    ]
