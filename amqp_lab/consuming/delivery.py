"""One delivery on its way through the consumer, and its report (pure).

:func:`prepare` turns what pika handed over into a :class:`Delivery` and never raises: a
delivery that cannot become a task - whatever is wrong with it - carries an InvalidMessage and
is dead-lettered as a business error, so one hostile message cannot stop the worker that
receives it (and then every other worker in turn).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from amqp_lab.consuming.settlement import attempt_number
from amqp_lab.dlq.record import utc_iso
from amqp_lab.errors import InvalidMessage, error_text
from amqp_lab.message import FIRST_SEEN_HEADER, Task, decode_body, header_attempts, properties_of
from amqp_lab.observability.tracing import start_process_span, trace_id_of
from amqp_lab.oneline import one_line

__all__ = ["Delivery", "DeliveryReport", "prepare"]


class DeliveryReport(NamedTuple):
    """One delivery's outcome, the metrics' names too (:mod:`amqp_lab.observability.outcomes`):
    processed | duplicate | requeued (basic.reject requeue) | retried (a retry copy in a wait
    queue, or held in the ordered worker) | dead-lettered | parked (the DLQ could not take it;
    it was left unacked, back in the queue when the worker stops). ``wait``: seconds until the
    retry (outcome retried); ``classification``: of a
    failure (business, transient, unknown, poison); ``error_type``: the exception's class name;
    ``handler_seconds``: the handler's run time (None: it did not run); ``trace_id``: the W3C
    trace id the message carried (``traceparent``), None without one. Immutable, as a named
    tuple: one is built per delivery, in a third of a frozen dataclass's time."""

    message_id: str | None
    outcome: str
    attempts: int
    redelivered: bool
    error: str | None = None
    wait: float | None = None
    classification: str | None = None
    error_type: str | None = None
    handler_seconds: float | None = None
    trace_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (``json.dumps(report.as_dict())``), for programs
        that read a worker's reports: :meth:`from_dict` reads it back."""
        return {
            "message_id": self.message_id,
            "outcome": self.outcome,
            "attempts": self.attempts,
            "redelivered": self.redelivered,
            "error": self.error,
            "wait": self.wait,
            "classification": self.classification,
            "error_type": self.error_type,
            "handler_seconds": self.handler_seconds,
            "trace_id": self.trace_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeliveryReport:
        """The report :meth:`as_dict` gave. Raises KeyError or TypeError on another shape."""
        return cls(
            message_id=data["message_id"],
            outcome=str(data["outcome"]),
            attempts=int(data["attempts"]),
            redelivered=bool(data["redelivered"]),
            error=data.get("error"),
            wait=data.get("wait"),
            classification=data.get("classification"),
            error_type=data.get("error_type"),
            handler_seconds=data.get("handler_seconds"),
            trace_id=data.get("trace_id"),
        )

    def line(self) -> str:
        """The report as one line for people: ``message_id=.. outcome=.. attempts=..``. One
        line whatever the message carried: the message_id is escaped
        (:func:`amqp_lab.oneline.one_line`), the error is quoted by ``repr``, which escapes
        every line break and control character too."""
        message_id = "None" if self.message_id is None else one_line(self.message_id)
        text = (
            f"message_id={message_id} outcome={self.outcome} attempts={self.attempts} "
            f"redelivered={str(self.redelivered).lower()}"
        )
        if self.wait is not None:
            text += f" wait={self.wait:.3f}"
        return text + (f" error={self.error!r}" if self.error else "")


@dataclass(slots=True)
class Delivery:
    """A delivery with what the consumer learnt about it. ``now``: receipt time, epoch s."""

    method: Any
    properties: Any
    body: bytes
    now: float
    message_id: str | None
    redelivered: bool
    headers: dict[Any, Any]
    attempt: int = 1  # this delivery's number: attempt_number(header_attempts, failures)
    header_attempts: int = 0  # our attempts header (failures settled by republishing)
    task: Task | None = None
    error: BaseException | None = None
    duplicate: bool = False
    first_seen_at: float | None = None  # recorded at the first failure (the store's memory)
    notes: tuple[str, ...] = ()  # e.g. why a retry copy was not written
    handler_seconds: float | None = None  # the handler's run time (handler thread)
    span: Any = None  # its OpenTelemetry process span, ended once settled
    trace_id: str | None = None  # the traceparent's trace id, when it carried one

    @property
    def delivery_tag(self) -> int:
        return int(self.method.delivery_tag)

    @property
    def store_key(self) -> str | None:
        """The message_id a dedup store may key this delivery by: None without one, and for
        one holding a NUL character, which PostgreSQL text cannot hold (:func:`prepare` made
        that delivery invalid; the report still shows its message_id)."""
        key = self.message_id
        return None if key is None or "\x00" in key else key

    def report(
        self,
        outcome: str,
        attempts: int,
        wait: float | None = None,
        classification: str | None = None,
    ) -> DeliveryReport:
        """This delivery's report (``wait``, ``classification``: see DeliveryReport)."""
        error = None
        if self.error is not None:
            error = f"{type(self.error).__name__}: {error_text(self.error)}"
        return DeliveryReport(
            self.message_id,
            outcome,
            attempts,
            self.redelivered,
            error,
            wait,
            classification if self.error is not None else None,
            None if self.error is None else type(self.error).__name__,
            self.handler_seconds,
            self.trace_id,
        )

    def start_span(self, queue: str, recording: bool | None = None) -> None:
        """Start this delivery's OpenTelemetry ``process <queue>`` span (ended once settled:
        :func:`~amqp_lab.observability.tracing.end_process_span`); with an SDK, a message
        without a trace starts one, whose id the report then carries. ``recording``: what
        :func:`~amqp_lab.observability.tracing.recording` said for the batch (None: ask
        it now)."""
        self.span = start_process_span(
            queue,
            self.headers,
            message_id=self.message_id,
            exchange=str(self.method.exchange),
            routing_key=str(self.method.routing_key),
            delivery_tag=self.delivery_tag,
            attempt=self.attempt,
            spans_record=recording,
        )
        context = self.span.get_span_context()
        if context.is_valid:
            self.trace_id = format(context.trace_id, "032x")

    def first_seen_iso(self) -> str:
        """When this message was first received, ISO 8601 UTC: our ``first_seen_at`` header
        (written on the first retry hop), else the store's memory of its first failure, else
        this delivery's receipt."""
        header = self.headers.get(FIRST_SEEN_HEADER)
        return header if isinstance(header, str) else utc_iso(self.first_seen_at or self.now)

    def properties_dict(self) -> dict[str, Any]:
        """The basic properties by name (headers apart; message_id too, unless it is not
        UTF-8 - then the record keeps its bytes here)."""
        props = properties_of(self.properties)
        raw_id = getattr(self.properties, "message_id", None)
        if isinstance(raw_id, bytes):
            props["message_id"] = raw_id
        return props


def prepare(
    method: Any,
    properties: Any,
    body: bytes,
    now: float,
    max_body_bytes: int,
) -> Delivery:
    """Decode one delivery. Never raises: a delivery that cannot be decoded carries an
    InvalidMessage saying why (no message_id, one that is not UTF-8, one holding a NUL
    character, which a PostgreSQL dedup store cannot claim; headers the codec could not read,
    a bad ``attempts`` header, a body too large, a JSON body that does not parse...)."""
    message_id = getattr(properties, "message_id", None)
    headers = getattr(properties, "headers", None)
    d = Delivery(
        method,
        properties,
        body,
        now,
        message_id if isinstance(message_id, str) and message_id else None,
        bool(getattr(method, "redelivered", False)),
        dict(headers) if isinstance(headers, dict) else {},
    )
    d.trace_id = trace_id_of(d.headers)
    try:
        _decode(d, message_id, properties, max_body_bytes)
    except InvalidMessage as e:
        d.error = e
    except Exception as e:  # whatever else a hostile delivery manages: never the worker's end
        d.error = InvalidMessage(f"cannot decode the delivery: {type(e).__name__}: {e}")
    return d


def _decode(d: Delivery, message_id: Any, properties: Any, max_body_bytes: int) -> None:
    header_error = getattr(properties, "header_error", None)
    if header_error:
        raise InvalidMessage(f"headers cannot be decoded: {header_error}")
    # a bad attempts header leaves the delivery's number at 1 for the report; a redelivered
    # delivery's failures recorded in the dedup store are added on the handler thread
    d.header_attempts = header_attempts(d.headers)
    d.attempt = attempt_number(d.header_attempts)
    if d.message_id is None:
        if isinstance(message_id, bytes):
            raise InvalidMessage("message_id property is not UTF-8")
        raise InvalidMessage("missing message_id property")
    if d.store_key is None:  # a NUL: AMQP allows it; PostgreSQL text cannot hold it (no claim)
        raise InvalidMessage("message_id contains a NUL character (U+0000)")
    content_type = getattr(properties, "content_type", None)
    if content_type is not None and not isinstance(content_type, str):
        raise InvalidMessage(f"content_type {content_type!r} is not UTF-8")
    d.task = Task(  # by position: keywords would double its cost (0.25 µs)
        d.message_id,
        decode_body(d.body, content_type, max_body_bytes),
        dict(d.headers),  # the handler's own copy: retries and records keep the original
        d.method.exchange,
        d.method.routing_key,
        d.redelivered,
        d.attempt,
        content_type,
    )
