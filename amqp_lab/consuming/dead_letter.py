"""The consumer's confirmed writes: a retry copy into a wait queue, a DLQ record to the DLX.

Both are published with confirms + mandatory on a channel of their own, and the original
delivery is acked only after the broker confirmed the write (classic-queue dead-lettering is
at-most-once: https://www.rabbitmq.com/docs/dlx#safety). :func:`dlq_message` builds the
record (pure, never raises); :class:`ConfirmedWriter` sends it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import pika.exceptions as pe
from opentelemetry.context import Context

from amqp_lab.connection import translate
from amqp_lab.consuming.delivery import Delivery
from amqp_lab.consuming.settlement import Outcome, Settlement
from amqp_lab.dlq.record import build_record, fallback_record, record_message
from amqp_lab.errors import DeadLetterFailed, UnencodableMessage
from amqp_lab.message import OutgoingMessage
from amqp_lab.observability.tracing import publish_span
from amqp_lab.publishing.confirm import Reply, outcome_error, publish_and_wait
from amqp_lab.retry.policy import full_jitter
from amqp_lab.settings import BrokerSettings

__all__ = ["RECORD_CLASS", "ConfirmedWriter", "StaleDelivery", "dlq_message"]

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


def dlq_message(
    d: Delivery,
    settlement: Settlement,
    *,
    first_seen_at: str,
    queue: str,
    dlx: str,
    failed_at: float,
) -> OutgoingMessage:
    """The message carrying ``d``'s DLQ record to ``dlx``. If building the record fails (never
    expected), a fallback record with the exact body, so the delivery still reaches the DLQ
    instead of failing the same way on every redelivery. ``failed_at`` in epoch seconds."""
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
            classification=RECORD_CLASS[settlement.classification],
            attempts=settlement.attempts,
            first_seen_at=first_seen_at,
            failed_at=failed_at,
            undecodable_headers=getattr(d.properties, "undecodable_headers", None),
        )
        if d.notes:
            record["retry_error"] = "; ".join(d.notes)
        return record_message(record, dlx, d.method.routing_key)
    except Exception as e:
        log.warning("DLQ record for message_id=%s could not be built: %r", d.message_id, e)
        record = fallback_record(
            body=d.body,
            message_id=d.message_id,
            queue=queue,
            error=d.error,
            problem=f"{type(e).__name__}: {e}",
        )
        return record_message(record, dlx, str(d.method.routing_key))


class ConfirmedWriter:
    """Publishes retry copies and DLQ records on one confirm-mode channel per connection,
    reopened when the broker closes it. ``attempts``: tries of one write; ``uniform`` draws
    the backoff between them (seconds)."""

    def __init__(
        self,
        settings: BrokerSettings,
        attempts: int = 3,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.settings = settings
        self.attempts = attempts
        self.uniform = uniform
        self._channel: Any = None

    def open(self, connection: Any) -> None:
        """A new confirm-mode channel on ``connection`` (call once per connection)."""
        self._channel = connection.channel()
        self._channel.confirm_delivery()

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
        pumping. Raises DeadLetterFailed when it was not confirmed, AccessRefused on a 403
        (permissions revoked mid-run: the worker's end, not this message's), StaleDelivery when
        the ``delivering`` channel has closed - nothing is written then: the delivery will come
        back, and writing now would make a second copy."""
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
                reply = publish_and_wait(self._channel, message, properties)
                if reply is Reply.ACK:
                    return
                problem = str(outcome_error(reply, message))
            except pe.ChannelClosedByBroker as e:
                self._channel = None
                if e.reply_code == 403:
                    raise translate(e, self.settings) from e
                problem = f"channel closed: {e.reply_code} {e.reply_text}"
            if attempt < self.attempts:
                connection.sleep(full_jitter(attempt, 0.1, 2.0, self.uniform))
        raise DeadLetterFailed(
            f"{what} to exchange {message.exchange!r} routing key {message.routing_key!r} was "
            f"not confirmed after {self.attempts} tries ({problem}); the original stays unacked"
        )
