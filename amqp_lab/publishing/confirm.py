"""The one map from a broker's reply to a publish to its outcome, shared by the blocking
:class:`~amqp_lab.publishing.blocking.Publisher`, the
:class:`~amqp_lab.publishing.pipelined.PipelinedPublisher` and the consumer's confirmed retry
and DLQ writes (:class:`~amqp_lab.consuming.dead_letter.ConfirmedWriter`).

With publisher confirms and ``mandatory`` (https://www.rabbitmq.com/docs/confirms), a publish
ends in exactly one :class:`Reply`:

* ``ACK`` - basic.ack: the broker has taken responsibility (persisted, for a persistent
  message on a durable queue);
* ``RETURNED`` - basic.return then basic.ack: no queue is bound for the routing key; the ack
  only says the broker is done with it (pika #543: without mandatory it would be dropped);
* ``NACKED`` - basic.nack: the broker could not take it (an internal error, or a queue at
  ``overflow: reject-publish``); a retry may succeed;
* ``CLOSED`` - the broker closed the channel instead (404 no exchange, 403, 406...);
* ``LOST`` - the connection went away before a reply: the outcome is unknown, and a retry
  may duplicate the message (the consumer's dedup absorbs it).

:func:`outcome_error` turns a reply into the error each publisher raises for it, so the three
publishers word and type every outcome the same way.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import pika.exceptions as pe

from amqp_lab.errors import (
    AmqpLabError,
    MessageNacked,
    MessageUnroutable,
    PublishFailed,
)
from amqp_lab.message import OutgoingMessage, Publishable

__all__ = ["Reply", "outcome_error", "publish_and_wait"]


class Reply(StrEnum):
    """What the broker answered to one publish (see the module doc)."""

    ACK = "ack"
    RETURNED = "returned"
    NACKED = "nacked"
    CLOSED = "closed"
    LOST = "lost"


def outcome_error(
    reply: Reply, message: Publishable, *, tries: int = 1, detail: str = ""
) -> AmqpLabError | None:
    """The error that ends ``message``'s publish after ``tries`` publishes whose last reply was
    ``reply``: None for ACK, MessageUnroutable for RETURNED, MessageNacked for NACKED,
    PublishFailed for LOST and CLOSED (``detail``: the broker's or the socket's words)."""
    where = f"exchange {message.exchange!r} routing key {message.routing_key!r}"
    if reply is Reply.ACK:
        return None
    if reply is Reply.RETURNED:
        return MessageUnroutable(
            f"returned unroutable: exchange {message.exchange!r} has no queue bound for "
            f"routing key {message.routing_key!r}",
            message.message_id,
        )
    if reply is Reply.NACKED:
        times = "once" if tries == 1 else f"{tries} times"
        return MessageNacked(f"nacked by the broker {times} ({where})", message.message_id)
    why = "the channel was closed" if reply is Reply.CLOSED else "the connection was lost"
    return PublishFailed(
        f"not confirmed after {tries} attempt{'' if tries == 1 else 's'}: {why} ({where})"
        + (f": {detail}" if detail else ""),
        message.message_id,
    )


def publish_and_wait(channel: Any, message: OutgoingMessage, properties: Any) -> Reply:
    """basic.publish ``message`` (mandatory) on a pika BlockingChannel in confirm mode and wait
    for the broker's reply: ACK, RETURNED or NACKED. A channel the broker closes raises pika's
    ChannelClosedByBroker, a lost connection pika's connection errors: the caller translates
    them (``connection.translate``), as only it knows whether to reopen the channel."""
    try:
        channel.basic_publish(
            message.exchange, message.routing_key, message.body, properties, mandatory=True
        )
    except pe.UnroutableError:
        return Reply.RETURNED
    except pe.NackError:
        return Reply.NACKED
    return Reply.ACK
