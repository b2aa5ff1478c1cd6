"""The plain consumer's units: a batch of decoded deliveries handed to a handler thread, and
when a partial batch starts (group commit).

A unit is ``(deliveries, future)``: the future of its store work on a handler thread, None
when it has none (every delivery failed to decode). The consumer decodes a batch while the
unit before it commits (the commit's fsync releases the GIL), and starts a partial batch as
soon as waiting would batch nothing more (:func:`start_now`).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from opentelemetry import trace

from amqp_lab.consuming.delivery import Delivery, prepare
from amqp_lab.observability.tracing import end_process_span, needs_span, recording

__all__ = [
    "InFlight",
    "decode_batch",
    "end_unsettled_spans",
    "start_now",
    "start_spans",
]

InFlight = tuple[list[Delivery], "Future[None] | None"]
"""A unit in flight: its deliveries and the future of its store work (None: nothing to run)."""


def start_now(channel: Any, units: list[InFlight]) -> bool:
    """Whether a partial batch starts at once: pika holds no further delivery on ``channel``
    and no unit is running, so waiting ``ack_interval`` would batch nothing more (group
    commit). Under load deliveries queue up while a unit commits and the batches fill; at a
    low rate each delivery starts when it arrives (publish -> processed latency:
    docs/benchmarks.md). With units running, a partial batch still waits up to
    ``ack_interval``: starting one unit per delivery beside them costs a transaction each
    (measured with ``--concurrency 4`` on SQLite: consumer ratio 0.26, p99 87 ms)."""
    if channel.get_waiting_message_count():
        return False
    return all(future is None or future.done() for _, future in units)


def decode_batch(
    deliveries: list[tuple[Any, Any, bytes]], now: float, max_body_bytes: int
) -> list[Delivery]:
    """Decode ``(method, properties, body)`` triples received at ``now`` (epoch seconds):
    :func:`~amqp_lab.consuming.delivery.prepare`, which never raises."""
    return [prepare(m, p, b, now, max_body_bytes) for m, p, b in deliveries]


def start_spans(batch: list[Delivery], queue: str) -> None:
    """Start each delivery's process span (ended once settled). Whether spans record is asked
    once per batch: OpenTelemetry's answer reads ``os.environ`` without an SDK."""
    spans = recording()
    for d in batch:
        if needs_span(d.headers, spans):
            d.start_span(queue, spans)
        else:  # what start_process_span would return, without its arguments built
            d.span = trace.INVALID_SPAN


def end_unsettled_spans(batch: list[Delivery]) -> None:
    """End the process span of each delivery of ``batch`` that was not settled (its unit's
    store work failed, or its channel closed: the broker redelivers it) as ``not-settled``."""
    for d in batch:
        if d.span is not None:
            end_process_span(d.span, "not-settled", d.error)
            d.span = None
