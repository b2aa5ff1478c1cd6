"""The handler contract on a real broker: async handlers are awaited in the dedup transaction
(also with several handlers at once); whatever a handler returns or raises has one outcome,
and "processed" means its code ran to the end (docs/failure-model.md, "The handler")."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.message import Task
from amqp_lab.settings import BrokerSettings
from tests.support import (
    consumer_config,
    get_all,
    one_error_line,
    publish,
    ready_count,
    run_script,
)

pytestmark = [pytest.mark.integration, pytest.mark.failure_model, pytest.mark.timeout(90)]


def _effects(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        try:
            return sorted(r[0] for r in db.execute("SELECT message_id FROM effects"))
        except sqlite3.OperationalError:  # no handler ever wrote
            return []


def _write(db: Any, task: Task) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS effects (message_id TEXT)")
    db.execute("INSERT INTO effects VALUES (?)", (task.message_id,))


def _consume(
    settings: BrokerSettings, handler: Any, store_path: Path, **options: Any
) -> list[DeliveryReport]:
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(store_path)
    try:
        options.setdefault("idle_exit", 1.0)
        Consumer(settings, handler, store, consumer_config(**options), reports.append).run()
    finally:
        store.close()
    return reports


def _records(settings: BrokerSettings) -> dict[str, dict[str, Any]]:
    return {p.message_id: json.loads(body) for _, p, body in get_all(settings, "q:tasks:dlq")}


def test_async_handlers_are_awaited_in_the_transaction_with_concurrency(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    async def handle(task: Task, db: Any) -> None:
        await asyncio.sleep(0.01)  # awaits, then writes in the claim's transaction
        _write(db, task)

    ids = [f"m-{n}" for n in range(24)]
    publish(topology, *(("ok", i) for i in ids))
    reports = _consume(topology, handle, tmp_path / "d.sqlite3", prefetch=8, concurrency=4)
    assert sorted(r.message_id or "" for r in reports if r.outcome == "processed") == sorted(ids)
    assert len(reports) == len(ids)
    assert _effects(tmp_path / "d.sqlite3") == sorted(ids)
    assert ready_count(topology, "q:tasks") == 0
    # the same ids again are duplicates: the async handler's claims were committed
    publish(topology, *(("ok", i) for i in ids[:3]))
    again = _consume(topology, handle, tmp_path / "d.sqlite3")
    assert [r.outcome for r in again] == ["duplicate"] * 3


def test_an_async_handlers_failure_is_retried_then_dead_lettered(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    async def handle(task: Task, db: Any) -> None:
        _write(db, task)  # rolled back with the failure
        raise TimeoutError("upstream timed out")

    publish(topology, ("ok", "m-async-fails"))
    reports = _consume(topology, handle, tmp_path / "d.sqlite3", prefetch=1)
    assert [(r.outcome, r.attempts) for r in reports] == [("requeued", 1), ("dead-lettered", 2)]
    assert _records(topology)["m-async-fails"]["classification"] == "transient"
    assert _effects(tmp_path / "d.sqlite3") == []


def generator_handler(task: Task, db: Any) -> Iterator[None]:
    _write(db, task)
    yield None


def test_a_handler_returning_a_generator_never_counts_as_processed(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """The bug class: a handler whose body never ran was acked as processed. A generator is
    refused when the consumer is made; one returned at run time is dead-lettered at once."""
    publish(topology, ("ok", "m-gen"))

    def returns_a_generator(task: Task, db: Any) -> Any:
        return generator_handler(task, db)

    reports = _consume(topology, returns_a_generator, tmp_path / "d.sqlite3", prefetch=1)
    assert [(r.outcome, r.attempts, r.classification) for r in reports] == [
        ("dead-lettered", 1, "business")
    ]
    record = _records(topology)["m-gen"]
    assert record["error"]["type"] == "HandlerContractError"
    assert "its body never ran" in record["error"]["message"]
    assert _effects(tmp_path / "d.sqlite3") == []


def test_an_async_handler_leaving_a_task_running_is_dead_lettered_without_its_writes(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    async def handle(task: Task, db: Any) -> None:
        async def later() -> None:
            await asyncio.sleep(5)
            _write(db, task)  # would run after the commit: never

        asyncio.get_running_loop().create_task(later())

    publish(topology, ("ok", "m-left"))
    reports = _consume(topology, handle, tmp_path / "d.sqlite3", prefetch=1)
    assert [r.outcome for r in reports] == ["dead-lettered"]
    assert "left 1 task(s) running" in _records(topology)["m-left"]["error"]["message"]
    assert _effects(tmp_path / "d.sqlite3") == []


class HostileError(Exception):
    @property
    def status_code(self) -> int:
        raise RuntimeError("reading me raises")

    def __str__(self) -> str:
        raise ValueError("no text for you")


def test_an_exception_that_raises_when_read_gets_the_unknown_outcome(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    def handle(task: Task, db: Any) -> None:
        raise HostileError

    publish(topology, ("ok", "m-hostile"))
    reports = _consume(topology, handle, tmp_path / "d.sqlite3", prefetch=1)
    assert [(r.outcome, r.classification) for r in reports] == [
        ("requeued", "unknown"),
        ("dead-lettered", "unknown"),
    ]
    record = _records(topology)["m-hostile"]
    assert record["error"] == {
        "type": "HostileError",
        "message": "<str() of HostileError raised ValueError>",
        "traceback": record["error"]["traceback"],
    }


def test_a_value_returned_by_a_handler_is_ignored(topology: BrokerSettings, tmp_path: Path) -> None:
    def handle(task: Task, db: Any) -> bool:
        _write(db, task)
        return False  # not a failure: only raising fails a delivery

    publish(topology, ("ok", "m-false"))
    reports = _consume(topology, handle, tmp_path / "d.sqlite3", prefetch=1)
    assert [r.outcome for r in reports] == ["processed"]
    assert _effects(tmp_path / "d.sqlite3") == ["m-false"]


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("def handle(task, db):\n    yield task\n", "is a generator function"),
        ("async def handle(task, db):\n    yield task\n", "is an async generator function"),
        ("def handle(task):\n    pass\n", "cannot be called as handler(task, db)"),
        ("handle = 42\n", "is not callable"),
        ("x = 1\ny = x / 0\n", "badhandlers.py:2: ZeroDivisionError: division by zero"),
        ("import no_such_dependency\n", "badhandlers.py:1: ModuleNotFoundError"),
    ],
    ids=["generator", "async-generator", "one-argument", "not-callable", "raises", "missing-dep"],
)
def test_the_worker_refuses_a_handler_it_cannot_honour_at_load_time(
    topology: BrokerSettings, tmp_path: Path, source: str, says: str
) -> None:
    (tmp_path / "badhandlers.py").write_text(textwrap.dedent(source))
    publish(topology, ("ok", "m-waits"))
    result = run_script(
        topology,
        "worker.py",
        "--handler",
        "badhandlers:handle",
        "--idle-exit",
        "1",
        "--dedup-path",
        str(tmp_path / "d.sqlite3"),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    line = one_error_line(result.stderr)
    assert "badhandlers:handle" in line and says in line
    assert ready_count(topology, "q:tasks") == 1  # nothing was consumed
