"""The worker's handler-time limit (handler_warn_after): one warning per delivery whose handler
outruns it, with an injected clock; the handler is never stopped."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from amqp_lab.consuming.config import ConsumerConfig
from amqp_lab.consuming.delivery import prepare
from amqp_lab.consuming.handler_watch import HandlerWatch
from amqp_lab.consuming.handling import HandlerRunner
from amqp_lab.consuming.store_retry import StoreRetry
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.errors import ConfigurationError, InvalidMessage
from amqp_lab.message import Task
from amqp_lab.topology import load_topology

pytestmark = pytest.mark.unit

NAMES = load_topology().names


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch(warn_after: float | None) -> tuple[HandlerWatch, Clock, list[tuple[Any, ...]]]:
    clock, warnings = Clock(), []
    w = HandlerWatch(warn_after, "q:tasks", clock, lambda *a: warnings.append(a))
    return w, clock, warnings


def rendered(warning: tuple[Any, ...]) -> str:
    return str(warning[0] % warning[1:])


def test_a_handler_past_the_limit_is_warned_about_once_with_id_queue_and_seconds() -> None:
    w, clock, warnings = watch(10)
    w.started(1, "m-1")
    clock.now += 9.9
    assert w.check() == 0
    clock.now += 0.2
    assert w.check() == 1
    clock.now += 50
    assert w.check() == 0  # once per delivery
    assert [rendered(x) for x in warnings] == [
        "handler of message_id=m-1 on queue 'q:tasks' has run for 10.1 s (handler_warn_after "
        "10 s); it is not stopped: the delivery stays unacked until it returns"
    ]


def test_a_handler_that_returned_in_time_is_never_warned_about() -> None:
    w, clock, warnings = watch(10)
    w.started(1, "m-1")
    clock.now += 5
    w.finished(1)
    clock.now += 100  # settling may take long: that is not the handler's time
    assert w.check() == 0
    w.forget([1])
    assert warnings == []


def test_a_rerun_after_a_store_outage_keeps_the_first_start_and_warns_once() -> None:
    w, clock, warnings = watch(10)
    w.started(1, "m-1")
    clock.now += 6
    w.finished(1)  # the store failed: the handler runs again
    clock.now += 1
    w.started(1, "m-1")
    clock.now += 4
    assert w.check() == 1  # 11 s since the delivery's first handler run
    w.finished(1)
    w.started(1, "m-1")
    clock.now += 30
    assert w.check() == 0
    assert len(warnings) == 1


def test_each_delivery_gets_its_own_warning_and_forgotten_ones_none() -> None:
    w, clock, warnings = watch(1)
    w.started(1, "a")
    w.started(2, "b")
    w.started(3, "c")
    w.forget([3])
    clock.now += 2
    assert w.check() == 2
    assert sorted(x[1] for x in warnings) == ["a", "b"]


def test_without_a_limit_nothing_is_watched() -> None:
    w, clock, warnings = watch(None)
    w.started(1, "m-1")
    clock.now += 1e6
    assert w.check() == 0
    assert warnings == []


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_limit_must_be_positive(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="handler_warn_after must be > 0"):
        ConsumerConfig(NAMES, handler_warn_after=bad)


def delivery(message_id: str, tag: int) -> Any:
    method = SimpleNamespace(delivery_tag=tag, redelivered=False, exchange="tasks", routing_key="t")
    props = SimpleNamespace(
        message_id=message_id, headers={}, content_type="application/json", header_error=None
    )
    return prepare(method, props, json.dumps({"n": tag}).encode(), 0.0, 1 << 20)


@pytest.mark.parametrize("ack_batch", [1, 2])
def test_the_runner_tells_the_watch_while_the_handler_runs_and_lets_it_finish(
    tmp_path: Path, ack_batch: int
) -> None:
    """The handler of the first delivery outruns the limit (the clock moves inside it, and the
    I/O thread's check runs meanwhile); it is warned about, goes on and commits; the second,
    quick one is not warned about."""
    w, clock, warnings = watch(30)
    done: list[str] = []

    def handler(task: Task, db: Any) -> None:
        if task.message_id == "slow":
            clock.now += 31
            assert w.check() == 1  # what the consumer's I/O thread sees meanwhile
        done.append(task.message_id)

    config = ConsumerConfig(NAMES, prefetch=2, ack_batch=ack_batch, handler_warn_after=30)
    with closing(SqliteDedupStore(tmp_path / "d.sqlite3")) as store:
        runner = HandlerRunner(handler, store, config, StoreRetry(0), w)
        batch = [delivery("slow", 1), delivery("quick", 2)]
        runner.process(batch)
        assert all(d.error is None and not d.duplicate for d in batch)
        assert store.is_processed("slow") and store.is_processed("quick")
    assert done == ["slow", "quick"]
    assert [x[1] for x in warnings] == ["slow"]
    clock.now += 100
    assert w.check() == 0  # the unit is done: nothing is left to watch


def test_prepare_gives_the_handler_every_field_of_the_delivery_in_its_place() -> None:
    """The Task is built by position (docs/benchmarks.md): every field must land where its name
    says, the two strings (exchange, routing key) not swapped. The report is immutable."""
    method = SimpleNamespace(
        delivery_tag=7, redelivered=True, exchange="tasks", routing_key="t.created"
    )
    props = SimpleNamespace(
        message_id="m-7",
        headers={"attempts": 2, "k": "v"},
        content_type="application/json; charset=utf-8",
        header_error=None,
    )
    d = prepare(method, props, b'{"n": 7}', 0.0, 1 << 20)
    assert d.error is None
    assert d.task == Task(
        message_id="m-7",
        body={"n": 7},
        headers={"attempts": 2, "k": "v"},
        exchange="tasks",
        routing_key="t.created",
        redelivered=True,
        attempt=3,
        content_type="application/json; charset=utf-8",
    )
    assert d.task.headers is not d.headers  # the handler's own copy
    report = d.report("processed", 3)
    with pytest.raises(AttributeError):
        report.outcome = "duplicate"  # type: ignore[misc]
    assert (report.message_id, report.outcome, report.attempts, report.redelivered) == (
        "m-7",
        "processed",
        3,
        True,
    )


@pytest.mark.parametrize(
    ("message_id", "reason"),
    [
        (None, "missing message_id property"),
        ("", "missing message_id property"),
        (b"m-\xff", "message_id property is not UTF-8"),
        ("m-\x00", "message_id contains a NUL character (U+0000)"),
        ("\x00", "message_id contains a NUL character (U+0000)"),
    ],
)
def test_a_message_id_no_store_can_claim_makes_the_delivery_invalid(
    message_id: Any, reason: str
) -> None:
    """No task, so no claim: a NUL failed a PostgreSQL store's whole batch and stopped the
    worker on every redelivery."""
    method = SimpleNamespace(delivery_tag=1, redelivered=True, exchange="", routing_key="q")
    props = SimpleNamespace(
        message_id=message_id, headers={}, content_type="application/json", header_error=None
    )
    d = prepare(method, props, b"{}", 0.0, 1 << 20)
    assert d.task is None
    assert isinstance(d.error, InvalidMessage)
    assert str(d.error) == reason


def test_a_message_id_holding_a_nul_never_reaches_the_store(tmp_path: Path) -> None:
    """Its failure is not noted (a PostgreSQL store failed on it, and the worker stopped),
    while a neighbour's is: two deliveries whose bodies are not JSON, one with a NUL."""
    method = SimpleNamespace(delivery_tag=1, redelivered=False, exchange="", routing_key="q")
    props = [
        SimpleNamespace(message_id=m, headers={}, content_type=None, header_error=None)
        for m in ("m-1", "m-\x00")
    ]
    good, bad = (prepare(method, p, b"{not json", 0.0, 1 << 20) for p in props)
    assert (good.store_key, bad.store_key) == ("m-1", None)
    assert isinstance(good.error, InvalidMessage) and isinstance(bad.error, InvalidMessage)
    noted: list[str] = []

    class Store(SqliteDedupStore):
        def note_failure(self, message_id: str, now: float, failures: int | None) -> float:
            noted.append(message_id)
            return super().note_failure(message_id, now, failures)

        def first_seen(self, message_id: str, now: float) -> float:
            noted.append(message_id)
            return super().first_seen(message_id, now)

    with closing(Store(tmp_path / "d.sqlite3")) as store:
        config = ConsumerConfig(NAMES)
        HandlerRunner(lambda task, db: None, store, config, StoreRetry(30.0)).process([good, bad])
    assert noted == ["m-1"]
    assert bad.message_id == "m-\x00"  # the report still names it
