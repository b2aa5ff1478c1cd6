"""Handlers the integration tests run in worker processes (``--handler
tests.worker_handlers:NAME``)."""

from __future__ import annotations

import os
import time
from typing import Any

from amqp_lab.message import Task


def timed_sleep(task: Task, db: Any) -> None:
    """Sleep ``body["seconds"]`` (an external call, outside the database), then record the
    run - message_id, process id, start and end (epoch seconds) - in ``handler_runs``."""
    started = time.time()
    time.sleep(float(task.body["seconds"]))
    db.execute(
        "CREATE TABLE IF NOT EXISTS handler_runs "
        "(message_id TEXT, pid INTEGER, started REAL, ended REAL)"
    )
    db.execute(
        "INSERT INTO handler_runs VALUES (?, ?, ?, ?)",
        (task.message_id, os.getpid(), started, time.time()),
    )


FOLLOW_UP_ROUTING_KEY = "follow-up"


def emit_follow_up(task: Task, db: Any) -> None:
    """Write ``body["n"]`` to ``applied`` and add a follow-up to the outbox in the same
    transaction (message_id ``follow-<message_id>``, routing key ``follow-up`` on the same
    exchange); with ``body["fail_once"]`` raise TransientError on the first attempt, after
    both writes, so they roll back together."""
    from amqp_lab.errors import TransientError
    from amqp_lab.message import OutgoingMessage, encode_json
    from amqp_lab.outbox import add

    db.execute("CREATE TABLE IF NOT EXISTS applied (message_id TEXT, n INTEGER)")
    db.execute("INSERT INTO applied VALUES (?, ?)", (task.message_id, task.body["n"]))
    follow_up = OutgoingMessage(
        body=encode_json({"of": task.message_id, "attempt": task.attempt}),
        message_id=f"follow-{task.message_id}",
        exchange=task.exchange,
        routing_key=FOLLOW_UP_ROUTING_KEY,
    )
    add(db, follow_up, key=str(task.body.get("key", "")) or None)
    if task.body.get("fail_once") and task.attempt == 1:
        raise TransientError("fails once, after its writes and its follow-up")
