"""W3C trace context across hops on a real broker: one trace shows the first try, every retry
through a wait queue, the dead-letter and the replay (an in-memory span exporter)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.dlq.ops import replay
from amqp_lab.errors import TransientError
from amqp_lab.message import Task
from amqp_lab.observability.tracing import use_tracer_provider
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.retry.policy import RetryPolicy
from amqp_lab.settings import BrokerSettings
from tests.support import NAMES, consumer_config, get_all, lab_message, wait_ready_count

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """An SDK TracerProvider exporting to memory, for amqp-lab's spans only and for this test
    only (use_tracer_provider): the process's global provider is left alone, so later tests'
    messages carry no trace context."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    use_tracer_provider(provider)
    try:
        yield memory
    finally:
        use_tracer_provider(None)
        provider.shutdown()


def consume(settings: BrokerSettings, tmp_path: Path, handler: Any, **options: Any) -> list[Any]:
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(str(tmp_path / "dedup.sqlite3"))
    config = consumer_config(idle_exit=1.5, concurrency=1, **options)
    try:
        Consumer(settings, handler, store, config, on_report=reports.append).run()
    finally:
        store.close()
    return reports


def test_one_trace_across_retries_dead_letter_and_replay(
    topology: BrokerSettings, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    with Publisher(topology) as publisher:
        publisher.publish(lab_message(body=b'{"n": 1}', message_id="traced-1"))
    failing = RetryPolicy("backoff", max_attempts=3, base=0.05, cap=0.2)

    def always_fails(task: Task, db: Any) -> None:
        raise TransientError("downstream unavailable")

    reports = consume(topology, tmp_path, always_fails, retry=failing)
    assert [(r.outcome, r.attempts) for r in reports] == [  # issue 23: retried (was requeued)
        ("retried", 1),
        ("retried", 2),
        ("dead-lettered", 3),
    ]
    wait_ready_count(topology, NAMES.dlq, 1)
    replayed = replay(topology, lambda e: e.message_id == "traced-1", queue=NAMES.dlq)
    assert [r.status for r in replayed] == ["replayed"]
    after = consume(topology, tmp_path / "fixed", lambda task, db: None)
    assert [(r.message_id, r.outcome) for r in after] == [("traced-1", "processed")]

    spans = exporter.get_finished_spans()
    trace_ids = {s.context.trace_id for s in spans}
    assert len(trace_ids) == 1, [(s.name, format(s.context.trace_id, "032x")) for s in spans]
    trace_id = format(trace_ids.pop(), "032x")
    # the reports (and the JSON logs) name the same trace
    assert {r.trace_id for r in reports + after} == {trace_id}

    by_id = {s.context.span_id: s for s in spans}
    process = [s for s in spans if s.name == "process q:tasks"]
    assert [(s.attributes or {}).get("amqp_lab.outcome") for s in process] == [
        "retried",
        "retried",
        "dead-lettered",
        "processed",
    ]
    assert [(s.attributes or {}).get("amqp_lab.attempt") for s in process] == [1, 2, 3, 1]
    assert all(s.kind is SpanKind.CONSUMER for s in process)

    def parent(span: ReadableSpan) -> ReadableSpan:
        assert span.parent is not None, span.name
        return by_id[span.parent.span_id]

    first_publish = parent(process[0])
    assert first_publish.name == "publish tasks" and first_publish.parent is None
    # each retry's process span is the child of the retry copy published by the one before
    for before, retry in itertools.pairwise(process[:3]):
        copy = parent(retry)
        assert copy.name == "publish (default)" and parent(copy) is before
    dead_letter = [s for s in spans if s.name == "publish tasks.dlx"]
    assert len(dead_letter) == 1 and parent(dead_letter[0]) is process[2]
    # the replay: in the same trace, linked to the context the record carried
    (replay_span,) = [s for s in spans if s.name == f"replay {NAMES.dlq}"]
    assert [link.context.span_id for link in replay_span.links] == [replay_span.parent.span_id]  # type: ignore[union-attr]
    replay_publish = parent(process[3])
    assert replay_publish.name == "publish tasks" and parent(replay_publish) is replay_span
    assert process[2].status.status_code is trace.StatusCode.ERROR


def test_a_malformed_traceparent_starts_a_new_trace_and_loses_nothing(
    topology: BrokerSettings, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    hostile = {"traceparent": "00-zzzz-not-a-trace-01", "tracestate": b"\xff\xfe"}
    with open_channel(topology) as channel:  # raw pika: our publisher would replace them
        channel.confirm_delivery()
        properties = pika.BasicProperties(message_id="hostile-1", headers=hostile)
        channel.basic_publish(NAMES.exchange, NAMES.routing_key, b"{}", properties)
    reports = consume(topology, tmp_path, lambda task, db: None)
    assert [(r.message_id, r.outcome) for r in reports] == [("hostile-1", "processed")]
    (process,) = [s for s in exporter.get_finished_spans() if s.name == "process q:tasks"]
    assert process.parent is None  # a new trace, not a crash
    # the report (and the JSON log line) names the trace the delivery's span started
    assert reports[0].trace_id == format(process.context.trace_id, "032x")
    assert get_all(topology, NAMES.queue) == []
