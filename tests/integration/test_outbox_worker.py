"""A handler's follow-ups through the outbox: the worker's ``--outbox`` relays what handlers add
on ``db``, which commits with their writes and their message_id claim or not at all (a batch:
with the delivery's savepoint); one trace from the writer's span to the follow-up's handler;
the outbox in the health check."""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.message import Task, message_for
from amqp_lab.observability.tracing import tracer, use_tracer_provider
from amqp_lab.outbox import add
from amqp_lab.outbox.observer import RelayConfig
from amqp_lab.outbox.relay import OutboxRelay
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from tests.pgsupport import temp_database
from tests.support import NAMES, consumer_config, get_all, parse_lines, run_script
from tests.worker_handlers import FOLLOW_UP_ROUTING_KEY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
HANDLER = "tests.worker_handlers:emit_follow_up"


@pytest.fixture
def follow_ups(topology: BrokerSettings) -> BrokerSettings:
    """The lab topology plus ``q:follow-ups`` bound to its exchange with ``follow-up``."""
    with open_channel(topology) as channel:
        channel.queue_declare("q:follow-ups", durable=True)
        channel.queue_bind("q:follow-ups", NAMES.exchange, FOLLOW_UP_ROUTING_KEY)
    return topology


def publish_tasks(settings: BrokerSettings, count: int) -> None:
    """``count`` tasks for emit_follow_up; every third fails once."""
    with Publisher(settings) as publisher:
        for n in range(count):
            body = {"n": n, "fail_once": n % 3 == 0, "key": f"k{n % 2}"}
            publisher.publish(message_for(NAMES, body, message_id=f"task-{n}"))


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_the_workers_relay_publishes_each_follow_up_once_with_its_handlers_commit(
    follow_ups: BrokerSettings, tmp_path: Path, store: str
) -> None:
    publish_tasks(follow_ups, 12)
    database = temp_database() if store == "postgresql" else nullcontext(str(tmp_path / "d.db"))
    with database as url:
        extra = ("--ack-batch", "4", "--prefetch", "12") if store == "postgresql" else ()
        result = run_script(
            follow_ups,
            "worker.py",
            "--handler",
            HANDLER,
            "--dedup-url",
            url,
            "--outbox",
            "--outbox-poll",
            "0.1",
            "--idle-exit",
            "2",
            *extra,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        lines = parse_lines(result.stdout)
        failed = {r["message_id"] for r in lines if r["outcome"] == "requeued"}
        assert failed == {f"task-{n}" for n in range(0, 12, 3)}
        bodies = {p.message_id: b for _, p, b in get_all(follow_ups, "q:follow-ups")}
        # one follow-up per task, from its successful attempt only: the failed attempt's
        # follow-up rolled back with its writes
        assert sorted(bodies) == sorted(f"follow-task-{n}" for n in range(12))
        for n in range(0, 12, 3):
            assert b'"attempt":2' in bodies[f"follow-task-{n}"]
        assert OutboxStore(url).status().pending == 0


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    use_tracer_provider(provider)
    try:
        yield memory
    finally:
        use_tracer_provider(None)
        provider.shutdown()


def test_one_trace_from_the_writing_transaction_to_the_handler(
    topology: BrokerSettings, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    url = str(tmp_path / "app.sqlite3")
    OutboxStore(url).close()
    db = sqlite3.connect(url)
    with tracer().start_as_current_span("place order"), db:
        add(db, message_for(NAMES, {"n": 1}, message_id="traced"))
    db.close()
    OutboxRelay(topology, url, RelayConfig(idle_exit=1.0, poll=0.1)).run()
    reports: list[DeliveryReport] = []
    dedup = SqliteDedupStore(str(tmp_path / "dedup.sqlite3"))

    def handle(task: Task, db: Any) -> None:
        with tracer().start_as_current_span("handle order"):
            pass

    config = consumer_config(idle_exit=1.5, concurrency=1)
    Consumer(topology, handle, dedup, config, on_report=reports.append).run()
    dedup.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    chain = ["place order", "create tasks", "publish tasks", "process q:tasks", "handle order"]
    assert set(chain) <= set(spans), sorted(spans)
    assert len({spans[name].context.trace_id for name in chain}) == 1
    for parent, child in itertools.pairwise(chain):
        link = spans[child].parent
        assert link is not None and link.span_id == spans[parent].context.span_id, child
    assert reports[0].trace_id == format(spans["place order"].context.trace_id, "032x")


def test_the_health_check_reports_an_outbox_that_waits(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    url = str(tmp_path / "app.sqlite3")
    OutboxStore(url).close()
    db = sqlite3.connect(url)
    with db:
        add(db, message_for(NAMES, {"n": 1}, message_id="waiting"), clock=lambda: time.time() - 600)
    db.close()
    unhealthy = run_script(
        topology, "health.py", "--min-consumers", "0", "--outbox-url", url, "--outbox-age", "60"
    )
    assert unhealthy.returncode == 2, unhealthy.stdout + unhealthy.stderr
    alerts = [line for line in unhealthy.stdout.splitlines() if line.startswith("ALERT:")]
    assert len(alerts) == 2, unhealthy.stdout
    assert "oldest pending row has waited 6" in alerts[0] and "0 relay(s) running" in alerts[1]
    OutboxRelay(topology, url, RelayConfig(idle_exit=0.5, poll=0.1)).run()
    healthy = run_script(
        topology, "health.py", "--min-consumers", "0", "--outbox-url", url, "--outbox-relays", "0"
    )
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "outbox pending=0" in healthy.stdout
