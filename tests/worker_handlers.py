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
