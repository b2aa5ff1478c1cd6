"""The outbox crash test's handlers (scripts/chaos.py --outbox), run by the real worker
(``scripts/worker.py --ordered 2 --handler lab.chaos_outbox_handlers:stage_a --outbox``).

Each writes one ``ledger`` row in the dedup transaction (no unique constraint: a second
application would show as a second row). Stage A also adds its follow-up for stage B to the
outbox on the same ``db`` - it commits with the ledger row and the message_id's claim, or not
at all - and fails once, after both writes, on the first try of every message whose ``n``
is 2 mod 5: the retry must not leave a second follow-up.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from amqp_lab.errors import TransientError
from amqp_lab.message import Task, message_for
from amqp_lab.outbox import add
from amqp_lab.topology import load_topology
from amqp_lab.topology.ordered import with_ordered
from lab.chaos_outbox import follow_up_id

__all__ = ["LEDGER_DDL", "STAGE_B_TOPOLOGY", "stage_a", "stage_b"]

STAGE_B_TOPOLOGY = Path(__file__).resolve().parent / "outbox_stage_b.json"
STAGE_B = with_ordered(load_topology(STAGE_B_TOPOLOGY), shards=2).names
LEDGER_DDL = {
    "sqlite": "CREATE TABLE IF NOT EXISTS ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "stage TEXT NOT NULL, message_id TEXT NOT NULL, key TEXT NOT NULL, applied_at REAL NOT NULL)",
    "postgresql": "CREATE TABLE IF NOT EXISTS ledger (id BIGINT GENERATED ALWAYS AS IDENTITY "
    "(CACHE 1) PRIMARY KEY, stage TEXT NOT NULL, message_id TEXT NOT NULL, key TEXT NOT NULL, "
    "applied_at DOUBLE PRECISION NOT NULL)",
}


def _ledger(db: Any, stage: str, task: Task) -> str:
    key = str(task.body["key"])
    db.execute(
        "INSERT INTO ledger (stage, message_id, key, applied_at) VALUES (?, ?, ?, ?)",
        (stage, task.message_id, key, time.time()),
    )
    return key


def stage_a(task: Task, db: Any) -> None:
    """Apply an order (a ledger row) and add its follow-up for stage B, keyed alike."""
    key = _ledger(db, "a", task)
    body = {"of": task.message_id, "key": key}
    add(db, message_for(STAGE_B, body, message_id=follow_up_id(task.message_id), key=key))
    if int(task.body.get("n", 0)) % 5 == 2 and task.attempt == 1:
        raise TransientError(f"{task.message_id}: fails once after its writes (rolled back)")


def stage_b(task: Task, db: Any) -> None:
    """Apply a follow-up (a ledger row)."""
    _ledger(db, "b", task)
