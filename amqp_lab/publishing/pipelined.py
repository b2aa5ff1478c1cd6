"""Pipelined confirming publisher: a bounded window of unconfirmed messages in flight.

Same safety as :class:`amqp_lab.publisher.Publisher` (publisher confirms, ``mandatory``,
persistent, a ``message_id`` on every message) without one round trip per message: up to
``window`` messages are in flight, the broker confirms them with ``basic.ack multiple=true``, and
each message's :class:`~concurrent.futures.Future` resolves with its own outcome:

* ``None`` - confirmed (basic.ack);
* :class:`~amqp_lab.errors.UnencodableMessage` - refused before sending (an expiration that is
  not whole milliseconds, a priority outside 0..255, a header value AMQP cannot carry): it fails
  alone and never closes the channel under the messages around it;
* :class:`~amqp_lab.errors.MessageUnroutable` - a basic.return for this very publish arrived
  before its ack (the broker sends the return first: https://www.rabbitmq.com/docs/confirms).
  Returns come in publish order and carry exchange, routing key and message_id, so each is
  matched to the earliest unconfirmed publish with all three: the same message_id in flight to
  a good and a bad routing key gets two different outcomes;
* :class:`~amqp_lab.errors.MessageNacked` - basic.nack on every attempt (retried with capped
  full-jitter backoff, same message_id);
* :class:`~amqp_lab.errors.NotFound` / ``AccessRefused`` / ``PreconditionFailed`` - the broker
  closed the channel because of this message: the reply names its exchange (404, 403) or its
  size (406 message size). The channel is reopened and every other unconfirmed message is
  republished, once: one that sees a second unexplained channel close fails with it;
* :class:`~amqp_lab.errors.BrokerBlocked` - the connection stayed blocked by a resource alarm
  longer than ``blocked_connection_timeout``;
* :class:`~amqp_lab.errors.PublishFailed` - reconnecting failed ``max_reconnects`` times.

No confirm for ``confirm_timeout`` seconds while messages are unconfirmed (a node on the
minority side of a partition confirms nothing and keeps the heartbeats going; a frozen node
sends nothing at all) counts as a lost connection: it is dropped and the publisher moves on
to the next node of the address list (:mod:`amqp_lab.publishing.confirm_watch`).

After a lost connection every unconfirmed message is republished with the same message_id on the
new connection (a duplicate is possible; the consumer's dedup absorbs it). Memory is bounded by
``window``: :meth:`PipelinedPublisher.publish` blocks while the window is full.

pika's SelectConnection runs on a dedicated I/O thread; callers on any thread hand messages over
through a deque and ``add_callback_threadsafe``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, TypeVar, cast

from pika.adapters.select_connection import IOLoop

from amqp_lab.connection import BlockedTime
from amqp_lab.errors import AmqpLabError, PublishFailed, UnencodableMessage
from amqp_lab.message import OutgoingMessage, Publishable
from amqp_lab.observability.guard import guarded
from amqp_lab.observability.tracing import with_current_context
from amqp_lab.publishing.batch import Outcome, PublishBatch
from amqp_lab.publishing.confirm_deadline import DEFAULT_CONFIRM_TIMEOUT
from amqp_lab.publishing.confirm_watch import ConfirmWatch
from amqp_lab.publishing.in_flight import InFlight, Pending
from amqp_lab.publishing.observer import NO_PUBLISHER_OBSERVER, PublisherObserver
from amqp_lab.publishing.pipelined_io import MAX_CHANNEL_REOPENS, PublisherIo, log
from amqp_lab.settings import BrokerSettings

__all__ = [
    "MAX_CHANNEL_REOPENS",
    "Outcome",
    "PipelinedPublisher",
    "PublishBatch",
]

T = TypeVar("T")


class PipelinedPublisher(PublisherIo):
    """``window``: most messages unconfirmed at once; ``max_attempts``: publishes of one message
    when nacked; ``base`` / ``cap``: backoff seconds for nack retries and reconnects;
    ``confirm_timeout``: seconds without a confirm, while messages are unconfirmed, after which
    the connection counts as lost (None: wait as long as the connection lives); ``observer``
    (e.g. :class:`amqp_lab.exporters.metrics.PublisherMetrics`): outcomes, confirm
    latencies, blocked periods and reconnects. A message handed over inside a span carries
    that span's W3C trace context (``traceparent``); no span per message is made.

    Counters for reports: ``reconnects``, ``channel_closes``, ``nacks`` (publishes nacked,
    retries included), ``confirms_timed_out`` (publishes unconfirmed when a confirm timeout
    dropped the connection), ``confirms_lost`` (publishes unconfirmed when the connection was
    lost otherwise); ``address``: the settings of the node the open connection goes to (None
    between connections)."""

    def __init__(
        self,
        settings: BrokerSettings,
        window: int = 500,
        max_attempts: int = 5,
        base: float = 0.1,
        cap: float = 5.0,
        max_reconnects: int = 10,
        observer: PublisherObserver = NO_PUBLISHER_OBSERVER,
        confirm_timeout: float | None = DEFAULT_CONFIRM_TIMEOUT,
    ) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.settings = settings
        self.observer = observer = guarded(observer)
        self._watch = ConfirmWatch(confirm_timeout)
        self._watching = 0  # the connection the confirm watch looks at (stale looks stop)
        self._timed_out = False  # the connection was dropped for a missing confirm
        self._blocked = BlockedTime(self._unblocked)
        self.window = window
        self.max_attempts = max_attempts
        self.base, self.cap = base, cap
        self.max_reconnects = max_reconnects
        self._in_flight = 0  # handed over and not yet resolved; at most ``window``
        self._room = threading.Condition()
        self._flight = InFlight()  # every publish without an outcome, by stage
        self._wake_pending = threading.Event()
        self._closing = False
        self._connection = None
        self._channel = None
        self._ready = threading.Event()
        self._failure = None
        self.reconnects = 0
        self.channel_closes = 0  # channels the broker closed (a 404, 403, 406...)
        self.nacks = self.confirms_timed_out = self.confirms_lost = 0
        self.address = None
        self._connecting = None
        self._channel_reopens = 0  # channel closes by the broker since the last confirm
        self._channel_was_open = False  # this connection reached an open channel
        self._ioloop = IOLoop()  # one loop for every connection, so wake-ups are never lost
        self._thread = threading.Thread(target=self._run, name="amqp-publisher-io", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) and self._failure is None:
            self._failure = PublishFailed("publisher did not connect within 30 s")
        if self._failure is not None:
            self.close()
            raise self._failure

    def __enter__(self) -> PipelinedPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def publish_async(
        self, message: OutgoingMessage, callback: Outcome | None = None
    ) -> Future[None]:
        """Hand ``message`` over; blocks while ``window`` messages are unconfirmed. The returned
        future (and ``callback``, on the I/O thread) get the message's outcome."""
        future: Future[None] = Future()

        def settle(msg: OutgoingMessage, error: AmqpLabError | None) -> None:
            if not future.done():  # the caller may have cancelled it
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
            if callback is not None:
                callback(msg, error)

        self._hand_over([Pending(message, settle)])
        return future

    def publish_each(self, messages: list[tuple[OutgoingMessage, Outcome]]) -> None:
        """Hand over every ``(message, callback)`` pair at once, each ``callback(message,
        error)`` called on the I/O thread with its own outcome, without a Future per message
        (the outbox relay's path); blocks while the window is full. A callback must not
        publish: it runs on the I/O thread, which alone frees window room."""
        for part in self._chunks([Pending(message, callback) for message, callback in messages]):
            self._hand_over(part)

    def publish_sealed(self, publishes: list[tuple[Publishable, Any, Outcome]]) -> None:
        """Hand over ``(message, properties, callback)`` triples whose properties the caller
        has already checked and encoded (an :class:`~amqp_lab.wire.AmqpProperties` after
        ``seal()``, or a :class:`~amqp_lab.wire.SealedProperties`) and whose headers carry
        whatever trace context they should: nothing is checked, encoded or injected here. As
        :meth:`publish_each` otherwise (the outbox relay's path for a plain row,
        :mod:`amqp_lab.outbox.sealing`). Raises ValueError for a message without a
        message_id."""
        items = [
            Pending(message, callback, properties) for message, properties, callback in publishes
        ]
        for item in items:
            if not item.message.message_id:
                raise ValueError("every message needs a message_id")
        for part in self._chunks(items):
            self._enqueue(part)

    def publish(self, message: OutgoingMessage, timeout: float | None = 60) -> None:
        """Publish and wait for this message's outcome; raises it (see the module doc)."""
        self.publish_async(message).result(timeout)

    def publish_many(self, messages: list[OutgoingMessage]) -> PublishBatch:
        """Hand over every message, pipelined and window-bounded; ``.wait()`` on the result."""
        batch = PublishBatch(len(messages))
        for part in self._chunks(messages):
            self._hand_over([Pending(m, batch._record) for m in part])
        return batch

    def _chunks(self, items: list[T]) -> Iterator[list[T]]:
        """``items`` in slices of a quarter window: each hand-over takes the lock once, and
        the I/O thread starts sending the first while the next waits for room."""
        step = max(1, self.window // 4)
        for i in range(0, len(items), step):
            yield items[i : i + step]

    def flush(self, timeout: float | None = 120) -> None:
        """Wait until every message handed over so far has an outcome (or ``timeout`` s)."""
        with self._room:
            if not self._room.wait_for(lambda: self._in_flight == 0, timeout):
                raise PublishFailed(f"flush: outcomes still pending after {timeout} s")

    def _hand_over(self, items: list[Pending]) -> None:
        for item in items:
            message = cast(OutgoingMessage, item.message)  # the public methods' Pendings
            if not message.message_id:
                raise ValueError("every message needs a message_id")
            item.message = message = with_current_context(message)
            try:
                item.properties = message.sealed_properties()
            except UnencodableMessage as e:
                item.error = e  # resolved on the I/O thread, never sent
        self._enqueue(items)

    def _enqueue(self, items: list[Pending]) -> None:
        """Queue ``items`` (sealed) for the I/O thread; blocks while the window is full."""
        if self._failure is not None:
            raise self._failure
        with self._room:
            while not self._room.wait_for(
                lambda: self._in_flight + len(items) <= self.window, timeout=1.0
            ):
                if self._failure is not None or not self._thread.is_alive():
                    raise self._failure or PublishFailed("the publisher's I/O thread stopped")
            self._in_flight += len(items)
        self._flight.incoming.extend(items)
        if not self._wake_pending.is_set():
            self._wake_pending.set()
            self._ioloop.add_callback_threadsafe(self._on_wake)

    @property
    def failure(self) -> AmqpLabError | None:
        """The error that ended this publisher for good (every later publish raises it), or
        None while it works: reconnects ran out, the credentials or the vhost were refused,
        the broker blocked the connection past its timeout, or its I/O thread stopped."""
        if self._failure is None and not self._thread.is_alive() and not self._closing:
            return PublishFailed("the publisher's I/O thread stopped")
        return self._failure

    def close(self, flush_timeout: float = 60) -> None:
        """Wait up to ``flush_timeout`` seconds for what is in flight, then close the connection
        and stop the I/O thread; a message still without an outcome (a nack retry waiting
        included) fails with PublishFailed."""
        if self._connection is not None and self._failure is None and not self._closing:
            try:
                self.flush(timeout=flush_timeout)
            except AmqpLabError as e:
                log.warning("closing with messages unconfirmed: %s", e)
        self._closing = True
        with contextlib.suppress(Exception):  # the loop may already be gone
            self._ioloop.add_callback_threadsafe(self._close_connection)
        self._thread.join(30)
        self._fail_all(PublishFailed("publisher closed before the broker confirmed"))
