"""The publishes a :class:`~amqp_lab.publishing.pipelined.PipelinedPublisher` holds, by stage
(pure bookkeeping, run on its I/O thread but for :attr:`InFlight.incoming`): handed over by a
caller, to send, sent and unconfirmed by delivery tag, nacked and waiting for their retry -
and which of them a basic.ack/nack, a basic.return or a channel.close is about.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amqp_lab.errors import AmqpLabError, MessageNacked, MessageUnroutable
from amqp_lab.message import Publishable
from amqp_lab.publishing.confirm import Reply, outcome_error

__all__ = ["InFlight", "Pending", "outcome_name"]

_MESSAGE_SIZE = re.compile(r"message size (\d+)")


@dataclass(slots=True)
class Pending:
    """One publish: the message (an OutgoingMessage, or what the caller sealed the properties
    of), its outcome callback (``on_outcome(message, error)``) and what the I/O thread knows
    of it."""

    message: Publishable
    on_outcome: Callable[[Any, AmqpLabError | None], None]
    properties: Any = None  # sealed (encoded once) in the caller's thread
    error: AmqpLabError | None = None  # refused before sending
    tries: int = 0
    sent_at: float = 0.0  # time.perf_counter() of its last basic.publish
    returned: bool = False  # a basic.return for this publish arrived (before its ack)
    closes: int = 0  # unexplained channel closes this message was in flight for


def outcome_name(error: AmqpLabError | None) -> str:
    """A publish outcome for the observer: confirmed, unroutable, nacked or failed."""
    if error is None:
        return "confirmed"
    if isinstance(error, MessageUnroutable):
        return "unroutable"
    return "nacked" if isinstance(error, MessageNacked) else "failed"


class InFlight:
    """``incoming``: handed over by callers (any thread appends); ``outstanding``: to send, in
    order; ``unconfirmed``: sent, by delivery tag (tags rise, so the oldest comes first);
    ``waiting``: nacked, a retry scheduled (by id)."""

    def __init__(self) -> None:
        self.incoming: collections.deque[Pending] = collections.deque()
        self.outstanding: collections.deque[Pending] = collections.deque()
        self.unconfirmed: collections.OrderedDict[int, Pending] = collections.OrderedDict()
        self.waiting: dict[int, Pending] = {}
        self._tag = 0

    def new_channel(self) -> None:
        """Delivery tags start over on a new channel."""
        self._tag = 0

    def sent(self, item: Pending) -> None:
        """``item`` was just published on the channel: it has the next delivery tag."""
        self._tag += 1
        self.unconfirmed[self._tag] = item

    def take_incoming(self) -> None:
        """Move what callers handed over to the end of the send queue."""
        while self.incoming:
            self.outstanding.append(self.incoming.popleft())

    def oldest_sent_at(self) -> float | None:
        """When the oldest unconfirmed publish was sent (None: none is)."""
        oldest = next(iter(self.unconfirmed.values()), None)
        return None if oldest is None else oldest.sent_at

    def confirmed(self, tag: int, multiple: bool) -> list[Pending]:
        """Pop the items a basic.ack/nack covers: every tag <= ``tag`` when ``multiple``.
        Tags are sent in increasing order, so they come off the front: O(1) per message."""
        if not multiple:
            item = self.unconfirmed.pop(tag, None)
            return [] if item is None else [item]
        items = []
        while self.unconfirmed:
            first = next(iter(self.unconfirmed))
            if first > tag:
                break
            items.append(self.unconfirmed.pop(first))
        return items

    def mark_returned(self, exchange: str, routing_key: str, message_id: Any) -> None:
        """Mark the publish a basic.return is for: the earliest unconfirmed one, not yet
        returned, with the same exchange, routing key and message_id (returns arrive in publish
        order, each before its own ack)."""
        key = (exchange, routing_key, message_id)
        for item in self.unconfirmed.values():
            m = item.message
            if not item.returned and (m.exchange, m.routing_key, m.message_id) == key:
                item.returned = True
                return

    def culprits(self, reply_text: str) -> list[int]:
        """The unconfirmed publishes a channel.close reply names: those to the exchange it
        names (404 NOT_FOUND, 403 ACCESS_REFUSED), or the first whose body has the size a 406
        names. Empty when the reply names none of them."""
        named = [
            tag
            for tag, item in self.unconfirmed.items()
            if f"exchange '{item.message.exchange}'" in reply_text
        ]
        if named:
            return named
        size = _MESSAGE_SIZE.search(reply_text)
        if size is not None:
            for tag, item in self.unconfirmed.items():
                if len(item.message.body) == int(size.group(1)):
                    return [tag]
        return []

    def requeue_unconfirmed(self, max_attempts: int) -> list[tuple[Pending, AmqpLabError | None]]:
        """Put every unconfirmed publish back at the front, in order, to be sent again - but
        one already sent ``max_attempts`` times is returned instead, failed: a message that
        kills every connection or channel it is sent on (a frame the broker refuses) must not
        be republished forever."""
        spent: list[tuple[Pending, AmqpLabError | None]] = []
        for _, item in sorted(self.unconfirmed.items(), reverse=True):
            if item.tries >= max_attempts:
                detail = "each time the connection or channel closed before the broker confirmed"
                error = outcome_error(Reply.LOST, item.message, tries=item.tries, detail=detail)
                spent.append((item, error))
            else:
                self.outstanding.appendleft(item)
        self.unconfirmed.clear()
        return spent

    def take_all(self) -> list[Pending]:
        """Every publish still without an outcome, removed from every stage."""
        pending = [
            *self.unconfirmed.values(),
            *self.outstanding,
            *self.incoming,
            *self.waiting.values(),  # nacked, waiting for their retry
        ]
        self.waiting.clear()
        self.unconfirmed.clear()
        self.outstanding.clear()
        self.incoming.clear()
        return pending
