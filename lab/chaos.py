"""The crash test's parts that are not orchestration: the ledger, the event plan, the worker
output tally and the summary with its invariant (used by scripts/chaos.py).

Each handler effect is one row in ``ledger``, written through the dedup store's connection inside
the claim's transaction, so the ledger shows exactly which message_ids were applied and how
often. The ledger has no unique constraint: a message applied twice shows as two rows.

Invariant of a safe run: every confirmed message_id is in the ledger exactly once, or in the DLQ
(``lost == 0`` and ``applied_twice == 0``), and ``redeliveries_seen > 0`` shows the run really
exercised redelivery.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.dedup import ManagedDedupStore
from amqp_lab.errors import DedupStoreError
from amqp_lab.message import Task
from lab.failover import Settled

T = TypeVar("T")

LEDGER_DDL = (
    "CREATE TABLE IF NOT EXISTS ledger ("
    " run_id TEXT NOT NULL, message_id TEXT NOT NULL, worker TEXT NOT NULL,"
    " applied_at DOUBLE PRECISION NOT NULL)"
)


def _in_store(store: ManagedDedupStore, what: str, work: Callable[[Any], T]) -> T:
    """``work(connection)`` in one store transaction; the driver's errors (sqlite3, psycopg)
    become DedupStoreError."""
    try:
        return store.run_in_transaction(work)
    except DedupStoreError:
        raise
    except Exception as e:
        raise DedupStoreError(f"cannot {what} in {store.location}: {e}") from e


def create_ledger(store: ManagedDedupStore) -> None:
    """CREATE TABLE IF NOT EXISTS ledger in the store's database (one transaction). Raises
    DedupStoreError."""
    _in_store(store, "create the ledger", lambda db: db.execute(LEDGER_DDL))


def ledger_handler(
    run_id: str, worker: str, work_seconds: float = 0.0
) -> Callable[[Task, Any], None]:
    """A consumer handler whose effect is one ledger row, written on the store's connection
    inside the dedup transaction, after ``work_seconds`` of pretend work."""

    def handle(task: Task, db: Any) -> None:
        if work_seconds > 0:
            time.sleep(work_seconds)
        db.execute(
            "INSERT INTO ledger(run_id, message_id, worker, applied_at) VALUES (?, ?, ?, ?)",
            (run_id, task.message_id, worker, time.time()),
        )

    return handle


def read_ledger(store: ManagedDedupStore, run_id: str) -> list[str]:
    """The message_ids of every ledger row of ``run_id`` (one per applied effect): one SELECT
    in its own transaction. Raises DedupStoreError (e.g. no ledger table)."""
    sql = "SELECT message_id FROM ledger WHERE run_id = ?"
    rows = _in_store(store, "read the ledger", lambda db: db.execute(sql, (run_id,)).fetchall())
    return [str(row[0]) for row in rows]


EventKind = Literal["kill", "close-worker", "close-publisher"]


@dataclass(frozen=True)
class Event:
    """Fire ``kind`` once ``at`` deliveries were seen (publisher closes: ``at`` confirms)."""

    kind: EventKind
    at: int


def plan_events(rng: random.Random, messages: int, kills: int, closes: int) -> list[Event]:
    """``kills`` SIGKILLs and ``closes`` forced connection closes at random progress points.
    Kills and worker closes: between 5 % and 80 % of ``messages`` deliveries. The closes
    alternate between the publisher and a worker; publisher closes count confirms, the first
    between 5 % and 25 % (early, so it surely lands mid-publishing), later ones up to 90 %.
    Sorted by ``at``."""

    def between(low: int, high: int) -> int:
        return rng.randint(max(1, low), max(1, low, high))

    n = messages
    events = [Event("kill", between(n // 20, n * 4 // 5)) for _ in range(kills)]
    for i in range(closes):
        if i == 0:
            events.append(Event("close-publisher", between(n // 20, n // 4)))
        elif i % 2 == 0:
            events.append(Event("close-publisher", between(n // 4, n * 9 // 10)))
        else:
            events.append(Event("close-worker", between(n // 20, n * 4 // 5)))
    return sorted(events, key=lambda e: e.at)


class OutputTally:
    """Counts the chaos workers' reports (one ``DeliveryReport.as_dict()`` JSON object per line,
    with ``at``: settled, and ``started``: the handler's start, in epoch seconds) in worker
    output files, reading only what was appended since the last call; a line cut short by a
    SIGKILL is ignored. ``settled`` keeps the times of each report (lab.failover)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.settled: list[Settled] = []
        self._offsets: dict[Path, int] = {}

    def update(self, paths: Iterable[Path]) -> int:
        """Read new complete lines of ``paths``; return the deliveries seen so far."""
        for path in paths:
            try:
                with path.open("rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    chunk = f.read()
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in chunk[:end].decode(errors="replace").splitlines():
                self.add(line)
        return self.counts["deliveries"]

    def add(self, line: str) -> None:
        """Count one output line (other lines are ignored)."""
        if not line.startswith("{"):
            return
        try:
            data = json.loads(line)
            report = DeliveryReport.from_dict(data)
        except (ValueError, KeyError, TypeError):
            return
        at, started = data.get("at"), data.get("started")
        if isinstance(at, int | float):
            began = started if isinstance(started, int | float) else None
            duplicate = report.outcome == "duplicate"
            self.settled.append(
                Settled(began, at, report.redelivered, report.message_id, duplicate)
            )
        self.counts["deliveries"] += 1
        self.counts[f"outcome:{report.outcome}"] += 1
        if report.redelivered:
            self.counts["redelivered"] += 1


def summarize(
    confirmed: Iterable[str], ledger_ids: Iterable[str], dlq_ids: Iterable[str], redeliveries: int
) -> dict[str, int]:
    """The run's summary: ``published_confirmed``, ``ledger_rows``, ``distinct_ledger_ids``,
    ``lost`` (confirmed, neither in the ledger nor in the DLQ), ``applied_twice`` (message_ids
    with more than one ledger row), ``redeliveries_seen`` and ``in_dlq`` (confirmed ids in the
    DLQ)."""
    wanted = set(confirmed)
    applied = Counter(ledger_ids)
    dead = set(dlq_ids) & wanted
    return {
        "published_confirmed": len(wanted),
        "ledger_rows": sum(applied.values()),
        "distinct_ledger_ids": len(applied),
        "lost": sum(1 for m in wanted if m not in applied and m not in dead),
        "applied_twice": sum(1 for n in applied.values() if n > 1),
        "redeliveries_seen": redeliveries,
        "in_dlq": len(dead),
    }


def invariant_holds(summary: dict[str, int]) -> bool:
    """Nothing lost, nothing applied twice, and redelivery really happened."""
    return (
        summary["lost"] == 0 and summary["applied_twice"] == 0 and summary["redeliveries_seen"] > 0
    )
