"""The lab's demo handler, kept apart from the library: it acts by the task's ``kind``.

* ``ok``: succeeds;
* ``flaky``: a transient error on its first delivery, success after;
* ``bad``: a plain exception every time, like a buggy task;
* ``invalid``: a business error (schema violation);
* ``slow``: succeeds after ``seconds`` (body field, default 2) of work;
* ``crash``: kills the worker process (``os._exit(70)``), like a segfault or the OOM killer.

Each success writes one row to an ``effects`` table inside the dedup transaction, so a test can
count side effects exactly.
"""

from __future__ import annotations

import os
import time
from typing import Any

from amqp_lab.dedup import placeholder_for
from amqp_lab.errors import BusinessError, TransientError
from amqp_lab.message import Task

KINDS = ("ok", "bad", "invalid", "flaky", "slow", "crash")
CRASH_EXIT_CODE = 70


def lab_handler(task: Task, db: Any) -> None:
    """Handle a lab task; raises TransientError, RuntimeError or BusinessError by kind, or
    ends the process (``crash``)."""
    kind = task.kind
    if kind == "crash":
        os._exit(CRASH_EXIT_CODE)
    if kind == "slow":
        seconds = task.body.get("seconds", 2)
        time.sleep(min(60.0, float(seconds)) if isinstance(seconds, int | float) else 2.0)
    if kind == "flaky" and task.attempt == 1:
        raise TransientError("upstream timed out (503) on the first delivery")
    if kind == "bad":
        raise RuntimeError("bug in task handler: division by zero")
    if kind == "invalid":
        raise BusinessError(f"schema violation: seq {task.body.get('seq')!r} has no 'customer'")
    if kind not in KINDS:
        raise BusinessError(f"unknown task kind {kind!r}")
    p = placeholder_for(db)  # SQLite or PostgreSQL, whichever the dedup store is
    _ensure_effects(db, postgres=p == "%s")
    db.execute(
        f"INSERT INTO effects(message_id, kind, applied_at) VALUES ({p}, {p}, {p})",
        (task.message_id, kind, time.time()),
    )


def _ensure_effects(db: Any, postgres: bool) -> None:
    """CREATE TABLE IF NOT EXISTS effects. On PostgreSQL two first transactions creating it at
    once collide (a unique violation in pg_type), so the first creation is serialized by a
    transaction-scoped advisory lock; once the table exists no lock is taken."""
    if postgres:
        if db.execute("SELECT to_regclass('effects')").fetchone()[0] is not None:
            return
        db.execute("SELECT pg_advisory_xact_lock(hashtext('amqp-lab effects'))")
    db.execute(
        "CREATE TABLE IF NOT EXISTS effects "
        "(message_id TEXT, kind TEXT, applied_at DOUBLE PRECISION)"
    )
