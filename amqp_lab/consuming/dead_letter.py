"""The consumer's confirmed writes: a retry copy into a wait queue, a DLQ record to the DLX.

Both are published with confirms + mandatory on a channel of their own, and the original
delivery is acked only after the broker confirmed the write (classic-queue dead-lettering is
at-most-once: https://www.rabbitmq.com/docs/dlx#safety). :func:`dlq_message` builds the
record (pure, never raises); :class:`ConfirmedWriter` sends it.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from typing import Any

import pika.exceptions as pe
from opentelemetry.context import Context

from amqp_lab.connection import translate
from amqp_lab.consuming.delivery import Delivery
from amqp_lab.consuming.settlement import Outcome, Settlement
from amqp_lab.dlq.raw_record import raw_record_message
from amqp_lab.dlq.record import build_record, fallback_record, record_message
from amqp_lab.errors import DeadLetterFailed, RecordTooLarge, UnencodableMessage
from amqp_lab.message import OutgoingMessage
from amqp_lab.observability.tracing import publish_span
from amqp_lab.publishing.confirm import Reply, outcome_error, publish_and_wait
from amqp_lab.publishing.confirm_deadline import DEFAULT_CONFIRM_TIMEOUT, confirm_deadline
from amqp_lab.retry.policy import Backoff
from amqp_lab.settings import BrokerSettings

__all__ = ["JSON_RECORD_LIMIT", "RECORD_CLASS", "ConfirmedWriter", "StaleDelivery", "dlq_message"]

log = logging.getLogger(__name__)

RECORD_CLASS = {
    Outcome.BUSINESS: "business",
    Outcome.TRANSIENT: "transient",
    Outcome.UNKNOWN: "unknown",
    Outcome.POISON: "poison",
}
"""The DLQ record's classification: ``unknown`` for an exception that is neither a business
nor a transient error - retried like a transient one, but a bug, not an outage."""


class StaleDelivery(Exception):
    """The channel that delivered a message closed before it was settled: the settlement (or
    the write before it) is dropped and the broker redelivers the message."""


JSON_RECORD_LIMIT = 16 * 1024 * 1024
"""The largest JSON record sent while the broker's ``max_message_size`` is unknown: RabbitMQ
4.x's default (16 MiB; 3.x: 128 MiB). A larger one goes in the raw form."""

WRITE_BACKOFF = Backoff(base=0.1, cap=2.0)
"""Between tries of one retry copy or DLQ record: 0.1 s doubling, at most 2 s."""

_SIZE_REFUSAL = re.compile(r"larger than configured max size (\d+)")


def dlq_message(
    d: Delivery,
    settlement: Settlement,
    *,
    first_seen_at: str,
    queue: str,
    dlx: str,
    failed_at: float,
    max_message_size: int | None = None,
) -> OutgoingMessage:
    """The message carrying ``d``'s DLQ record to ``dlx``: the JSON record when it fits
    (``max_message_size``: the broker's limit in bytes, None while unknown:
    :data:`JSON_RECORD_LIMIT` then), else its raw form (:mod:`amqp_lab.dlq.raw_record`: the
    body as it is). If building the record fails (never expected), a fallback record with the
    exact body, so the delivery still reaches the DLQ instead of failing the same way on every
    redelivery. ``failed_at`` in epoch seconds. Raises RecordTooLarge when no form fits: the
    body is over a known ``max_message_size``, or the message's own headers fill the frame."""
    assert d.error is not None
    record = _record_of(d, settlement, first_seen_at, queue, failed_at)
    routing_key = str(d.method.routing_key)
    message = record_message(record, dlx, routing_key)
    if len(message.body) <= (max_message_size or JSON_RECORD_LIMIT):
        return message
    if max_message_size is not None and len(d.body) > max_message_size:
        raise RecordTooLarge(
            f"the DLQ record of message_id={d.message_id} cannot fit: its body of "
            f"{len(d.body)} bytes is over the broker's max_message_size ({max_message_size})",
            max_message_size,
        )
    raw = raw_record_message(
        record,
        body=d.body,
        headers=d.headers,
        properties=d.properties_dict(),
        dlx=dlx,
        routing_key=routing_key,
    )
    if raw is None:
        raise RecordTooLarge(
            f"the DLQ record of message_id={d.message_id} cannot fit: its own headers leave "
            "no room in one frame for the record's"
        )
    return raw


def _record_of(
    d: Delivery, settlement: Settlement, first_seen_at: str, queue: str, failed_at: float
) -> dict[str, Any]:
    """``d``'s DLQ record; a fallback record with the exact body if building it fails."""
    assert d.error is not None
    try:
        record = build_record(
            body=d.body,
            message_id=d.message_id,
            exchange=d.method.exchange,
            routing_key=d.method.routing_key,
            queue=queue,
            properties=d.properties_dict(),
            headers=d.headers,
            error=d.error,
            classification=RECORD_CLASS.get(settlement.classification, "unknown"),
            attempts=settlement.attempts,
            first_seen_at=first_seen_at,
            failed_at=failed_at,
            undecodable_headers=getattr(d.properties, "undecodable_headers", None),
        )
        if d.notes:
            record["retry_error"] = "; ".join(d.notes)
    except Exception as e:
        log.warning("DLQ record for message_id=%s could not be built: %r", d.message_id, e)
        record = fallback_record(
            body=d.body,
            message_id=d.message_id,
            queue=queue,
            error=d.error,
            problem=f"{type(e).__name__}: {e}",
        )
    return record


class ConfirmedWriter:
    """Publishes retry copies and DLQ records on one confirm-mode channel per connection,
    reopened when the broker closes it. ``attempts``: tries of one write; ``uniform`` draws
    the backoff between them (seconds); ``max_message_size``: the broker's limit in bytes
    (None: unknown), learnt from the broker's refusal of a larger message (406
    PRECONDITION_FAILED "message size N is larger than configured max size M");
    ``confirm_timeout``: seconds a write waits for its confirm while ``blocked()`` is false
    before the connection is dropped (:func:`confirm_deadline`; None: no limit)."""

    def __init__(
        self,
        settings: BrokerSettings,
        attempts: int = 3,
        uniform: Callable[[float, float], float] = random.uniform,
        max_message_size: int | None = None,
        confirm_timeout: float | None = DEFAULT_CONFIRM_TIMEOUT,
        blocked: Callable[[], bool] = lambda: False,
    ) -> None:
        self.confirm_timeout = confirm_timeout
        self.blocked = blocked
        self.settings = settings
        self.attempts = attempts
        self.uniform = uniform
        self.max_message_size = max_message_size
        self._channel: Any = None

    def open(self, connection: Any) -> None:
        """A new confirm-mode channel on ``connection`` (call once per connection)."""
        self._channel = connection.channel()
        self._channel.confirm_delivery()

    def write_record(
        self,
        connection: Any,
        delivering: Any,
        build: Callable[[int | None], OutgoingMessage],
        what: str,
        parent: Context | None = None,
    ) -> None:
        """:meth:`write` the DLQ record ``build(max_message_size)`` makes; when the broker
        refuses it for its size, learn the limit and write the smaller form ``build`` then
        makes. Raises what :meth:`write` raises, and RecordTooLarge when no form fits."""
        for _ in range(2):
            message = build(self.max_message_size)
            try:
                self.write(connection, delivering, message, what, parent)
                return
            except RecordTooLarge as e:
                if e.limit is None or len(message.body) <= e.limit:
                    raise  # the headers, or a limit that explains nothing: no smaller form
        raise RecordTooLarge(f"{what}: refused for its size twice", self.max_message_size)

    def write(
        self,
        connection: Any,
        delivering: Any,
        message: OutgoingMessage,
        what: str,
        parent: Context | None = None,
    ) -> None:
        """Publish ``message`` with confirms + mandatory, in a ``publish`` span that is a child
        of ``parent`` (the delivery's process span) whose trace context the message carries;
        up to ``attempts`` tries (a nack, a
        return, a channel closed by the broker), with backoff while the connection keeps
        pumping. Raises RecordTooLarge at once when the broker refuses it for its size
        (nothing to retry), DeadLetterFailed when it was not confirmed, AccessRefused on a 403
        (permissions revoked mid-run: the worker's end, not this message's), StaleDelivery when
        the ``delivering`` channel has closed - nothing is written then: the delivery will come
        back, and writing now would make a second copy. A lost connection raises pika's error
        as it is (StreamLostError when no confirm came within ``confirm_timeout``): the
        consumer translates it (``connection.translate``) and reconnects."""
        with publish_span(message, parent) as (_, traced):
            self._write(connection, delivering, traced, what)

    def _write(self, connection: Any, delivering: Any, message: OutgoingMessage, what: str) -> None:
        try:
            properties = message.sealed_properties()
        except UnencodableMessage as e:
            raise DeadLetterFailed(f"{what} cannot be encoded: {e}") from e
        problem = ""
        for attempt in range(1, self.attempts + 1):
            if not delivering.is_open:
                raise StaleDelivery(f"{what}: channel closed before settlement; not written")
            try:
                if self._channel is None or not self._channel.is_open:
                    self.open(connection)
                with confirm_deadline(connection, self.confirm_timeout, self.blocked):
                    reply = publish_and_wait(self._channel, message, properties)
                if reply is Reply.ACK:
                    return
                problem = str(outcome_error(reply, message))
            except pe.ChannelClosedByBroker as e:
                self._channel = None
                if e.reply_code == 403:
                    raise translate(e, self.settings) from e
                too_large = _SIZE_REFUSAL.search(str(e.reply_text))
                if e.reply_code == 406 and too_large:
                    self.max_message_size = int(too_large.group(1))
                    raise RecordTooLarge(
                        f"{what} ({len(message.body)} bytes) is over the broker's "
                        f"max_message_size ({self.max_message_size})",
                        self.max_message_size,
                    ) from e
                problem = f"channel closed: {e.reply_code} {e.reply_text}"
            if attempt < self.attempts:
                connection.sleep(WRITE_BACKOFF.wait(attempt, self.uniform))
        raise DeadLetterFailed(
            f"{what} to exchange {message.exchange!r} routing key {message.routing_key!r} was "
            f"not confirmed after {self.attempts} tries ({problem}); the original stays unacked"
        )
