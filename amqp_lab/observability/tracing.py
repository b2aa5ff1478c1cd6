"""W3C trace context through AMQP headers, and the spans of publishing, processing and replay.

The publisher injects ``traceparent`` and ``tracestate`` (https://www.w3.org/TR/trace-context/)
into the message's headers; the consumer extracts them and opens a consumer span for the
delivery; a retry copy and a DLQ record carry the context of the process span that failed, so
the next attempt continues the same trace; a replay opens a span in the record's trace with a
link to it. One trace then shows the first try, each retry, the dead-letter and the replay.

Span names and attributes follow the OpenTelemetry messaging semantic conventions
(https://opentelemetry.io/docs/specs/semconv/messaging/rabbitmq/): ``publish <exchange>``
(PRODUCER), ``process <queue>`` (CONSUMER), ``messaging.system = rabbitmq``,
``messaging.destination.name``, ``messaging.rabbitmq.destination.routing_key``,
``messaging.message.id``, ``messaging.rabbitmq.message.delivery_tag``; amqp-lab adds
``amqp_lab.attempt`` and ``amqp_lab.outcome``.

Only the OpenTelemetry *API* is used. Without an SDK (no TracerProvider installed) every span
is a non-recording one: nothing is exported and the cost is a few attribute look-ups; an
incoming ``traceparent`` is still passed on unchanged to retry copies and DLQ records, so a
trace survives a hop through a worker that does not trace.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from amqp_lab.errors import error_text
from amqp_lab.message import OutgoingMessage
from amqp_lab.settings import mask_url

__all__ = [
    "TRACE_HEADERS",
    "context_from_headers",
    "context_of",
    "end_process_span",
    "inject",
    "needs_span",
    "publish_span",
    "recording",
    "replay_span",
    "start_process_span",
    "trace_id_of",
    "tracer",
    "use_tracer_provider",
    "with_current_context",
]

TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C trace-context headers carried in AMQP message headers."""

log = logging.getLogger(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()
_INSTRUMENTATION = "amqp_lab"


_provider: trace.TracerProvider | None = None


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Make amqp-lab's spans go to ``provider`` instead of the global TracerProvider (None:
    back to the global one). OpenTelemetry lets a process set its global provider once; this
    lets a test, or an application with several pipelines, choose per library."""
    global _provider
    _provider = provider


def recording() -> bool:
    """Whether spans can be recorded: a provider was given (:func:`use_tracer_provider`) or a
    global one set (an SDK). Without either, OpenTelemetry's global provider is its proxy and
    every span is a non-recording one."""
    if _provider is not None:
        return True
    return not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def tracer() -> trace.Tracer:
    """amqp-lab's tracer: from :func:`use_tracer_provider`'s provider, else the global
    TracerProvider (a no-op one without an SDK)."""
    if _provider is not None:
        return _provider.get_tracer(_INSTRUMENTATION)
    return trace.get_tracer(_INSTRUMENTATION)


def _text_headers(headers: Mapping[Any, Any] | None) -> dict[str, str]:
    """The trace headers of ``headers`` as text (AMQP may carry them as bytes); hostile
    values (another type, bytes that are not UTF-8) are ignored, never raised."""
    carrier: dict[str, str] = {}
    for name in TRACE_HEADERS:
        value = (headers or {}).get(name)
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                continue
        if isinstance(value, str) and len(value) <= 512:
            carrier[name] = value
    return carrier


def context_from_headers(headers: Mapping[Any, Any] | None) -> Context:
    """The trace context an AMQP message carries (an empty Context when it carries none, or
    one the W3C parser rejects: a malformed ``traceparent`` starts a new trace)."""
    return _PROPAGATOR.extract(_text_headers(headers))


def _carries_context(headers: Mapping[Any, Any] | None) -> bool:
    return bool(headers) and "traceparent" in headers  # type: ignore[operator]


def needs_span(headers: Mapping[Any, Any] | None, spans_record: bool) -> bool:
    """Whether a delivery with ``headers`` gets a process span of its own: spans record (an
    SDK), or it carries a trace context to pass on. Otherwise :func:`start_process_span` gives
    the shared invalid span, and a consumer can set it without the call."""
    return spans_record or _carries_context(headers)


def trace_id_of(headers: Mapping[Any, Any] | None) -> str | None:
    """The 32-hex-digit trace id in ``headers``' ``traceparent`` (None when absent or invalid).
    Works without an SDK: it is what the JSON logs print. Never raises."""
    if not _carries_context(headers):
        return None
    try:
        span_context = trace.get_current_span(context_from_headers(headers)).get_span_context()
    except Exception:  # hostile headers: no trace id, never the delivery's failure
        return None
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def inject(headers: dict[Any, Any], context: Context | None = None) -> dict[Any, Any]:
    """A copy of ``headers`` with ``traceparent`` / ``tracestate`` of ``context`` (default: the
    current one). When that context holds no valid span, the headers are returned as they
    were, so a context the message already carries is kept."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    if not carrier:
        return dict(headers)
    out = {k: v for k, v in headers.items() if k not in TRACE_HEADERS}
    out.update(carrier)
    return out


def with_current_context(message: OutgoingMessage) -> OutgoingMessage:
    """``message`` carrying the current trace context in its headers (the same object when
    there is no valid current span: nothing to carry, nothing copied). For the pipelined
    publisher, which propagates the caller's context without a span per message."""
    if not trace.get_current_span().get_span_context().is_valid:
        return message
    return replace(message, headers=inject(message.headers))


def _message_attributes(message: OutgoingMessage) -> dict[str, Any]:
    return {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "send",
        "messaging.destination.name": message.exchange,
        "messaging.rabbitmq.destination.routing_key": message.routing_key,
        "messaging.message.id": message.message_id,
    }


@contextmanager
def publish_span(
    message: OutgoingMessage, parent: Context | None = None
) -> Iterator[tuple[Span, OutgoingMessage]]:
    """A PRODUCER span ``publish <exchange>`` around one publish (child of ``parent``, or of
    the current context), and ``message`` with that span's context injected into its headers.
    The caller publishes the returned message inside the ``with`` block; an exception leaving
    the block is recorded on the span."""
    name = f"publish {message.exchange or '(default)'}"
    with tracer().start_as_current_span(
        name, context=parent, kind=SpanKind.PRODUCER, attributes=_message_attributes(message)
    ) as span:
        yield span, replace(message, headers=inject(message.headers))


def start_process_span(
    queue: str,
    headers: Mapping[Any, Any] | None,
    *,
    message_id: str | None,
    exchange: str,
    routing_key: str,
    delivery_tag: int,
    attempt: int,
    spans_record: bool | None = None,
) -> Span:
    """Start (not end) the CONSUMER span ``process <queue>`` of one delivery, child of the
    context its headers carry. :func:`end_process_span` ends it once the delivery is settled;
    run the handler inside ``trace.use_span(span, end_on_exit=False)`` so its own spans are
    children. Costs nothing without an SDK when the message carries no trace context: the
    shared invalid span then (nothing to record, nothing to pass on)."""
    if spans_record is None:  # a batch asks once (recording() reads os.environ without an SDK)
        spans_record = recording()
    if not needs_span(headers, spans_record):
        return trace.INVALID_SPAN
    attributes: dict[str, Any] = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "process",
        "messaging.destination.name": exchange,
        "messaging.rabbitmq.destination.routing_key": routing_key,
        "messaging.rabbitmq.message.delivery_tag": delivery_tag,
        "messaging.consumer.group.name": queue,
        "amqp_lab.attempt": attempt,
    }
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    return tracer().start_span(
        f"process {queue}",
        context=context_from_headers(headers),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )


def end_process_span(span: Span, outcome: str, error: BaseException | None) -> None:
    """End a process span with its settlement: ``amqp_lab.outcome`` (processed, duplicate,
    requeued, dead-lettered, parked...) and, for a failed handler, the exception and an
    ERROR status."""
    if span is trace.INVALID_SPAN:
        return  # nothing recorded (start_process_span without an SDK or a trace context)
    try:
        span.set_attribute("amqp_lab.outcome", outcome)
        if error is not None:  # the message masked, as in every log line
            span.record_exception(error, {"exception.message": mask_url(error_text(error))})
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}"))
        span.end()
    except Exception as e:  # an exporter's bug must not reach settlement
        log.warning("ending the process span failed (ignored): %s: %s", type(e).__name__, e)


@contextmanager
def replay_span(
    queue: str, headers: Mapping[Any, Any] | None, message_id: str | None
) -> Iterator[Span]:
    """The span of one DLQ replay, current inside the block: PRODUCER ``replay <dlq>`` in the
    trace the record carries (its parent is the record's context, so first try, retries,
    dead-letter and replay share one trace) and linked to that context
    (``amqp_lab.link = replay-of``). A record without trace context starts a new trace."""
    context = context_from_headers(headers)
    origin = trace.get_current_span(context).get_span_context()
    links = [Link(origin, {"amqp_lab.link": "replay-of"})] if origin.is_valid else []
    attributes: dict[str, Any] = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "send",
        "amqp_lab.replay.queue": queue,
    }
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    with tracer().start_as_current_span(
        f"replay {queue}",
        context=context,
        kind=SpanKind.PRODUCER,
        links=links,
        attributes=attributes,
    ) as span:
        yield span


def context_of(span: Span | None) -> Context | None:
    """A Context whose current span is ``span`` (None stays None): the parent for a write made
    on behalf of a delivery after its handler returned."""
    return None if span is None else trace.set_span_in_context(span)
