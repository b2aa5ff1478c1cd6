#!/usr/bin/env python3
"""What observability costs per delivery, without a broker: the trace-context work the
consumer does for every delivery (extract, process span, end) with the OpenTelemetry API alone
and with the SDK recording, the Prometheus observer's calls per delivery, and a JSON log line.

Prints microseconds per delivery (median of --repeat runs of --n deliveries). Compare with
the consumer's own cost per delivery in docs/benchmarks.md (hundreds of microseconds).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry

from amqp_lab.cli.parser import CommandParser
from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.exporters.metrics import ConsumerMetrics
from amqp_lab.observability.logs import json_line, report_event
from amqp_lab.observability.tracing import (
    end_process_span,
    start_process_span,
    trace_id_of,
)

HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k": 1}


def per_delivery_us(work: Callable[[], None], n: int, repeat: int) -> float:
    """Median microseconds of one call of ``work`` over ``repeat`` runs of ``n`` calls."""
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(n):
            work()
        runs.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(runs)


def traced() -> None:
    trace_id_of(HEADERS)
    span = start_process_span(
        "q:tasks",
        HEADERS,
        message_id="m-1",
        exchange="tasks",
        routing_key="task",
        delivery_tag=1,
        attempt=1,
    )
    end_process_span(span, "processed", None)


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="deliveries per run")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    report = DeliveryReport("m-1", "processed", 1, False, handler_seconds=0.001, trace_id="x")
    metrics = ConsumerMetrics("/", "q:tasks", CollectorRegistry())

    def observed() -> None:
        metrics.unacked(1)
        metrics.store_call("process_once", 0.001)
        metrics.settled(report)
        metrics.batch_settled(1)
        metrics.unacked(0)

    def logged() -> None:
        json_line("delivery", **report_event(report, queue="q:tasks", vhost="/"))

    rows = [("trace context, API only (no SDK)", per_delivery_us(traced, args.n, args.repeat))]
    rows.append(("Prometheus observer (5 calls)", per_delivery_us(observed, args.n, args.repeat)))
    rows.append(("JSON log line", per_delivery_us(logged, args.n, args.repeat)))
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        print("(opentelemetry-sdk not installed: the SDK row is skipped)")
    else:
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(provider)

        def recorded() -> None:
            traced()
            memory.clear()

        rows.append(("trace context, SDK recording", per_delivery_us(recorded, args.n, 3)))
    width = max(len(name) for name, _ in rows)
    print(f"{'per delivery':<{width}}  microseconds (median of {args.repeat} x {args.n})")
    for name, us in rows:
        print(f"{name:<{width}}  {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
