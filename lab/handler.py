"""The lab's demo handler and its tasks: ``{"kind": ..., "seq": n}`` JSON bodies.

* ``ok``: succeeds;
* ``flaky``: a transient error on its first delivery, success after;
* ``bad``: a plain exception every time, like a buggy task;
* ``invalid``: a business error (schema violation);
* ``slow``: succeeds after ``seconds`` (body field, default 2) of work;
* ``crash``: kills the worker process (``os._exit(70)``), like a segfault or the OOM killer.

A body that is not such a task is a business error (InvalidMessage): the schema is the lab's,
not the library's. Each success writes one row to an ``effects`` table inside the dedup
transaction, so a test can count side effects exactly.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from amqp_lab.errors import BusinessError, InvalidMessage, TransientError
from amqp_lab.message import ATTEMPTS_HEADER, JSON, OutgoingMessage, Task, encode_json
from amqp_lab.topology import load_topology

KINDS = ("ok", "bad", "invalid", "flaky", "slow", "crash")
CRASH_EXIT_CODE = 70
_NAMES = load_topology().names  # the lab topology: topology/definitions.json
EXCHANGE, ROUTING_KEY = _NAMES.exchange, _NAMES.routing_key


def task_message(
    kind: str,
    seq: int,
    message_id: str | None = None,
    *,
    exchange: str = EXCHANGE,
    routing_key: str = ROUTING_KEY,
    persistent: bool = True,
) -> OutgoingMessage:
    """The lab task ``{"kind": kind, "seq": seq}`` with ``attempts: 0``; uuid4 if no id."""
    return OutgoingMessage(
        body=encode_json({"kind": kind, "seq": seq}),
        message_id=message_id or str(uuid.uuid4()),
        exchange=exchange,
        routing_key=routing_key,
        headers={ATTEMPTS_HEADER: 0},
        persistent=persistent,
    )


def lab_body(task: Task) -> dict[str, Any]:
    """The task's body as the lab expects it. Raises InvalidMessage when it is not a JSON object
    whose ``kind`` is a string."""
    if isinstance(task.body, bytes):
        raise InvalidMessage(f"unsupported content_type {task.content_type!r}, expected {JSON}")
    if not isinstance(task.body, dict):
        raise InvalidMessage(f"body must be a JSON object, got {type(task.body).__name__}")
    if not isinstance(task.body.get("kind"), str):
        raise InvalidMessage("body field 'kind' must be a string")
    return task.body


def lab_handler(task: Task, db: Any) -> None:
    """Handle a lab task; raises TransientError, RuntimeError or BusinessError by kind, or
    ends the process (``crash``)."""
    body = lab_body(task)
    kind = body["kind"]
    if kind == "crash":
        os._exit(CRASH_EXIT_CODE)
    if kind == "slow":
        seconds = body.get("seconds", 2)
        time.sleep(min(60.0, float(seconds)) if isinstance(seconds, int | float) else 2.0)
    if kind == "flaky" and task.attempt == 1:
        raise TransientError("upstream timed out (503) on the first delivery")
    if kind == "bad":
        raise RuntimeError("bug in task handler: division by zero")
    if kind == "invalid":
        raise BusinessError(f"schema violation: seq {body.get('seq')!r} has no 'customer'")
    if kind not in KINDS:
        raise BusinessError(f"unknown task kind {kind!r}")
    _ensure_effects(db)
    db.execute(
        "INSERT INTO effects(message_id, kind, applied_at) VALUES (?, ?, ?)",
        (task.message_id, kind, time.time()),
    )


def _ensure_effects(db: Any) -> None:
    """CREATE TABLE IF NOT EXISTS effects. On PostgreSQL two first transactions creating it at
    once collide (a unique violation in pg_type), so the first creation is serialized by a
    transaction-scoped advisory lock; once the table exists no lock is taken."""
    if db.dialect == "postgresql":
        if db.execute("SELECT to_regclass('effects')").fetchone()[0] is not None:
            return
        db.execute("SELECT pg_advisory_xact_lock(hashtext('amqp-lab effects'))")
    db.execute(
        "CREATE TABLE IF NOT EXISTS effects "
        "(message_id TEXT, kind TEXT, applied_at DOUBLE PRECISION)"
    )
