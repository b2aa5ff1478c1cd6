"""A message's trace through the outbox: from the writing transaction to its handler.

:func:`writer_context` is called by :func:`amqp_lab.outbox.add` in the writer's thread: the
W3C trace context (``traceparent``, ``tracestate``, https://www.w3.org/TR/trace-context/) of
the current span is stored with the row. With an OpenTelemetry SDK recording, a PRODUCER span
``create <exchange>`` (``messaging.operation.type = create``) is made there - a child of the
current span, or the root of a new trace - and its context is stored instead, so a message
written outside any span still gets a trace.

The relay, possibly another process and much later, publishes the row with that context in
the message's headers (:func:`relay_message`); with an SDK it opens a ``publish <exchange>``
span, child of the stored context, ended when the broker confirms or refuses. The consumer's
``process <queue>`` span continues from it (:mod:`amqp_lab.observability.tracing`): one trace
holds the writer's span, ``create``, ``publish`` and ``process``. Without an SDK and without
a current span nothing is stored and nothing costs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from amqp_lab.message import OutgoingMessage
from amqp_lab.observability.tracing import (
    TRACE_HEADERS,
    context_from_headers,
    inject,
    recording,
    tracer,
)

__all__ = ["end_relay_span", "relay_message", "stored_context", "writer_context"]


def _attributes(message: OutgoingMessage, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": operation,
        "messaging.destination.name": message.exchange,
        "messaging.rabbitmq.destination.routing_key": message.routing_key,
        "messaging.message.id": message.message_id,
    }


def writer_context(message: OutgoingMessage) -> tuple[str | None, str | None]:
    """``(traceparent, tracestate)`` to store with ``message``'s row (None, None when there is
    no trace to carry: no SDK and no current span). Never raises: tracing must not fail a
    write."""
    try:
        if recording():
            name = f"create {message.exchange or '(default)'}"
            with tracer().start_as_current_span(
                name, kind=SpanKind.PRODUCER, attributes=_attributes(message, "create")
            ):
                carrier = inject({})
        elif trace.get_current_span().get_span_context().is_valid:
            carrier = inject({})
        else:
            return None, None
    except Exception:  # an SDK's bug must not roll back the writer's transaction
        return None, None
    parent, state = carrier.get("traceparent"), carrier.get("tracestate")
    return (
        parent if isinstance(parent, str) else None,
        state if isinstance(state, str) and state else None,
    )


def relay_message(
    message: OutgoingMessage,
    traceparent: str | None,
    tracestate: str | None,
    spans_record: bool | None = None,
) -> tuple[OutgoingMessage, Span | None]:
    """``message`` as the relay publishes it: the row's stored trace context in its headers
    (replacing any trace header the writer put there: the stored one is the writer's own),
    and - with an SDK - the ``publish`` span to end with :func:`end_relay_span` once the
    publish has its outcome (None without one). ``spans_record``: what
    :func:`~amqp_lab.observability.tracing.recording` said for the batch (None: ask it now;
    without an SDK OpenTelemetry's answer reads ``os.environ``, measured at 7% of the relay
    thread's time when asked per row)."""
    stored: dict[str, str] = {}
    if traceparent:
        stored["traceparent"] = traceparent
        if tracestate:
            stored["tracestate"] = tracestate
    span: Span | None = None
    if recording() if spans_record is None else spans_record:
        try:
            span = tracer().start_span(
                f"publish {message.exchange or '(default)'}",
                context=context_from_headers(stored) if stored else None,
                kind=SpanKind.PRODUCER,
                attributes=_attributes(message, "send"),
            )
            headers = inject(message.headers, trace.set_span_in_context(span))
            return replace(message, headers=headers), span
        except Exception:
            span = None
    if not stored:
        return message, None
    headers = stored_context(message.headers, stored["traceparent"], tracestate)
    return replace(message, headers=headers), None


def stored_context(
    headers: dict[str, Any], traceparent: str, tracestate: str | None
) -> dict[str, Any]:
    """``headers`` with a row's stored trace context (a new dict): any trace header the writer
    put there is dropped, the stored ``traceparent`` (and ``tracestate``, when not empty) go
    in. What a relay without an SDK publishes for a row that has one."""
    out = {k: v for k, v in headers.items() if k not in TRACE_HEADERS}
    out["traceparent"] = traceparent
    if tracestate:
        out["tracestate"] = tracestate
    return out


def end_relay_span(span: Span | None, error: BaseException | None) -> None:
    """End a relay's ``publish`` span with the publish's outcome (never raises)."""
    if span is None:
        return
    try:
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.set_attribute("amqp_lab.outbox.error", f"{type(error).__name__}: {error}"[:300])
        span.end()
    except Exception:
        pass
