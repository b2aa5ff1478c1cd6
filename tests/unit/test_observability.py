"""Metrics, trace context, JSON logs and blocked time without a broker: each outcome moves the
right counter, trace headers survive hostile input, log lines are JSON and masked."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import CollectorRegistry, generate_latest

from amqp_lab.connection import BlockedTime
from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.consuming.observer import NO_OBSERVER
from amqp_lab.exporters.metrics import ConsumerMetrics, PublisherMetrics
from amqp_lab.message import OutgoingMessage
from amqp_lab.observability.guard import guarded
from amqp_lab.observability.logs import JsonFormatter, json_line, report_event
from amqp_lab.observability.outcomes import OUTCOMES
from amqp_lab.observability.tracing import (
    context_from_headers,
    inject,
    trace_id_of,
    with_current_context,
)

pytestmark = pytest.mark.unit

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
RETRIED = "amqp_lab_consumer_retried_total"


def report(outcome: str, **kw: Any) -> DeliveryReport:
    return DeliveryReport("m-1", outcome, kw.pop("attempts", 1), False, **kw)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"vhost": "v", "queue": "q", **labels}) or 0.0


@pytest.mark.parametrize(
    ("given_report", "name", "labels"),
    [
        (report("processed"), "amqp_lab_consumer_processed_total", {}),
        (report("duplicate"), "amqp_lab_consumer_duplicates_total", {}),
        (report("requeued"), "amqp_lab_consumer_requeued_total", {}),
        # issue 23: a retry copy into a wait queue and the ordered worker's held retry are
        # both reported as "retried" (they were "requeued" with a wait, and "held")
        (
            report("retried", wait=0.5, attempts=2),
            "amqp_lab_consumer_retried_total",
            {"attempt": "2"},
        ),
        (
            report("retried", wait=0.5, attempts=3),
            "amqp_lab_consumer_retried_total",
            {"attempt": "3"},
        ),
        (report("parked"), "amqp_lab_consumer_parked_total", {}),
        (
            report("dead-lettered", classification="business", error_type="BusinessError"),
            "amqp_lab_consumer_dead_lettered_total",
            {"classification": "business", "error_type": "BusinessError"},
        ),
        (
            report("dead-lettered"),
            "amqp_lab_consumer_dead_lettered_total",
            {"classification": "unknown", "error_type": "unknown"},
        ),
    ],
)
def test_each_outcome_moves_one_counter(
    given_report: DeliveryReport, name: str, labels: dict[str, str]
) -> None:
    registry = CollectorRegistry()
    metrics = ConsumerMetrics("v", "q", registry)
    metrics.settled(given_report)
    assert sample(registry, name, **labels) == 1
    counters = [
        "amqp_lab_consumer_processed_total",
        "amqp_lab_consumer_duplicates_total",
        "amqp_lab_consumer_requeued_total",
        "amqp_lab_consumer_parked_total",
    ]
    others = [c for c in counters if c != name]
    assert [sample(registry, c) for c in others] == [0.0] * len(others)


def test_every_outcome_name_is_a_metric_name() -> None:
    """The log and the metrics say the same word: each outcome has its counter (a plural for
    duplicate), and a name the table does not know moves none."""
    registry = CollectorRegistry()
    metrics = ConsumerMetrics("v", "q", registry)
    names = {family.name for family in registry.collect()}
    for outcome in OUTCOMES:
        word = outcome.replace("-", "_")
        assert {f"amqp_lab_consumer_{word}", f"amqp_lab_consumer_{word}s"} & names, outcome
    metrics.settled(report("held", wait=0.5))  # no such outcome (any more)
    moved = [
        s for f in registry.collect() for s in f.samples if s.name.endswith("_total") and s.value
    ]
    assert moved == []


def test_no_created_series() -> None:
    """prometheus-client's _created series are off (disable_created_metrics)."""
    registry = CollectorRegistry()
    ConsumerMetrics("v", "q", registry).settled(report("processed", handler_seconds=0.1))
    PublisherMetrics("v", registry).outcome("tasks", "confirmed")
    text = generate_latest(registry).decode()
    assert "amqp_lab_consumer_processed_total" in text
    assert "_created" not in text


def test_the_other_consumer_events() -> None:
    registry = CollectorRegistry()
    metrics = ConsumerMetrics("v", "q", registry)
    metrics.settled(report("processed", handler_seconds=0.2))
    metrics.batch_settled(5)
    metrics.unacked(7)
    metrics.reconnected()
    metrics.blocked(1.5)
    metrics.blocked(2.0)
    metrics.store_call("process_once", 0.004)
    assert sample(registry, "amqp_lab_consumer_handler_duration_seconds_count") == 1
    assert sample(registry, "amqp_lab_consumer_handler_duration_seconds_sum") == pytest.approx(0.2)
    assert sample(registry, "amqp_lab_consumer_ack_batch_deliveries_sum") == 5
    assert sample(registry, "amqp_lab_consumer_unacked_deliveries") == 7
    assert sample(registry, "amqp_lab_consumer_reconnects_total") == 1
    assert sample(registry, "amqp_lab_consumer_blocked_seconds_total") == pytest.approx(3.5)
    store = "amqp_lab_dedup_store_duration_seconds_count"
    assert sample(registry, store, operation="process_once") == 1


def test_publisher_metrics() -> None:
    registry = CollectorRegistry()
    metrics = PublisherMetrics("v", registry)
    metrics.outcome("tasks", "confirmed")
    metrics.outcome("tasks", "unroutable")
    metrics.confirmed_after("tasks", 0.003)
    labels = {"vhost": "v", "exchange": "tasks"}
    get = registry.get_sample_value
    assert get("amqp_lab_publisher_published_total", {**labels, "outcome": "confirmed"}) == 1
    assert get("amqp_lab_publisher_published_total", {**labels, "outcome": "unroutable"}) == 1
    assert get("amqp_lab_publisher_confirm_duration_seconds_count", labels) == 1
    assert get("amqp_lab_publisher_reconnects_total", {"vhost": "v"}) == 0  # present from start


def test_blocked_time_counts_each_period_once() -> None:
    now = [100.0]
    seen: list[float] = []
    blocked = BlockedTime(seen.append, clock=lambda: now[0])
    blocked.closed()  # not blocked: nothing
    blocked.on_blocked()
    now[0] = 103.0
    blocked.on_blocked()  # a second connection.blocked changes nothing
    now[0] = 110.0
    assert blocked.blocked
    blocked.closed()  # connection.unblocked
    blocked.closed()
    assert seen == [10.0] and not blocked.blocked


def test_trace_context_round_trips_through_headers() -> None:
    assert trace_id_of({"traceparent": TRACEPARENT}) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id_of({"traceparent": TRACEPARENT.encode()}) == trace_id_of(
        {"traceparent": TRACEPARENT}
    )
    carried = inject({"a": 1}, context_from_headers({"traceparent": TRACEPARENT}))
    assert carried == {"a": 1, "traceparent": TRACEPARENT}


def test_without_a_valid_context_the_headers_are_kept_as_they_were() -> None:
    headers = {"traceparent": TRACEPARENT, "x": b"y"}
    assert inject(headers) == headers  # no current span: nothing replaced
    message = OutgoingMessage(body=b"", message_id="m", headers={"k": 1})
    assert with_current_context(message) is message  # no copy made


def test_the_current_span_is_carried_by_a_pipelined_message() -> None:
    parent = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))
    message = OutgoingMessage(body=b"", message_id="m", headers={"k": 1})
    with trace.use_span(NonRecordingSpan(parent)):
        carried = with_current_context(message)
    assert carried.headers["k"] == 1
    assert trace_id_of(carried.headers) == format(0xABC, "032x")


@given(
    st.dictionaries(
        st.sampled_from(["traceparent", "tracestate", "other"]),
        st.one_of(st.text(), st.binary(), st.integers(), st.none(), st.lists(st.integers())),
    )
)
def test_hostile_trace_headers_never_raise(headers: dict[str, Any]) -> None:
    trace_id = trace_id_of(headers)
    assert trace_id is None or len(trace_id) == 32
    context_from_headers(headers)


def test_json_lines_are_json_and_masked() -> None:
    line = json_line(
        "delivery",
        message_id="m-1",
        error="cannot reach amqp://app:s3cret@broker:5672/v",
        nested={"url": "http://u:pw@h/"},
        nothing=None,
        odd=object(),
    )
    event = json.loads(line)
    assert event["event"] == "delivery" and event["level"] == "info"
    assert event["ts"].endswith("Z") and "nothing" not in event
    assert "s3cret" not in line and "pw@" not in line
    assert event["message_id"] == "m-1"


def test_report_event_has_the_fields_a_log_pipeline_indexes() -> None:
    r = report(
        "dead-lettered",
        attempts=3,
        error="RuntimeError: boom",
        classification="unknown",
        error_type="RuntimeError",
        handler_seconds=0.1234567,
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    )
    fields = report_event(r, queue="q:tasks", vhost="/")
    assert fields["queue"] == "q:tasks" and fields["vhost"] == "/"
    assert fields["handler_seconds"] == 0.123457
    assert DeliveryReport.from_dict(r.as_dict()) == r


def test_the_json_formatter_masks_log_records() -> None:
    record = logging.LogRecord(
        "amqp_lab.x", logging.WARNING, __file__, 1, "lost %s", ("amqps://a:b@h/v",), None
    )
    event = json.loads(JsonFormatter(queue="q").format(record))
    assert event["level"] == "warning" and event["queue"] == "q"
    assert event["message"] == "lost amqps://a:***@h/v"


def test_a_guarded_observer_logs_and_swallows(caplog: pytest.LogCaptureFixture) -> None:
    class Raising:
        def settled(self, report: DeliveryReport) -> None:
            raise ValueError("bug")

    observer = guarded(Raising())
    with caplog.at_level(logging.WARNING):
        observer.settled(report("processed"))  # does not raise
    assert "observer settled raised (ignored): ValueError: bug" in caplog.text
    assert guarded(NO_OBSERVER) is NO_OBSERVER  # nothing to guard, nothing wrapped
