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

After a lost connection every unconfirmed message is republished with the same message_id on the
new connection (a duplicate is possible; the consumer's dedup absorbs it). Memory is bounded by
``window``: :meth:`PipelinedPublisher.publish` blocks while the window is full.

pika's SelectConnection runs on a dedicated I/O thread; callers on any thread hand messages over
through a deque and ``add_callback_threadsafe``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions as pe
from pika.adapters.select_connection import IOLoop

from amqp_lab.connection import (
    BlockedTime,
    address_order,
    channel_error,
    connection_parameters,
    translate,
)
from amqp_lab.errors import (
    AmqpLabError,
    AuthenticationFailed,
    BrokerBlocked,
    MessageNacked,
    MessageUnroutable,
    PublishFailed,
    UnencodableMessage,
    VhostAccessDenied,
)
from amqp_lab.message import OutgoingMessage
from amqp_lab.observability.guard import guarded
from amqp_lab.observability.tracing import with_current_context
from amqp_lab.publishing.confirm import Reply, outcome_error
from amqp_lab.publishing.observer import NO_PUBLISHER_OBSERVER, PublisherObserver
from amqp_lab.retry.policy import full_jitter
from amqp_lab.settings import BrokerSettings

__all__ = [
    "MAX_CHANNEL_REOPENS",
    "Outcome",
    "PipelinedPublisher",
    "PublishBatch",
]

log = logging.getLogger(__name__)
MAX_CHANNEL_REOPENS = 5


Outcome = Callable[[OutgoingMessage, AmqpLabError | None], None]
"""``callback(message, error)``: error is None when the broker confirmed the message."""


class PublishBatch:
    """Outcomes of one :meth:`PipelinedPublisher.publish_many` call, without a Future per
    message: ``confirmed`` counts acks, ``failures`` lists (message, error)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.confirmed = 0
        self.failures: list[tuple[OutgoingMessage, AmqpLabError]] = []
        self._done = threading.Event()
        if size == 0:
            self._done.set()

    def _record(self, message: OutgoingMessage, error: AmqpLabError | None) -> None:
        # only the publisher's I/O thread writes here: no lock per message
        if error is None:
            self.confirmed += 1
        else:
            self.failures.append((message, error))
        if self.confirmed + len(self.failures) == self.size:
            self._done.set()

    def wait(self, timeout: float | None = 120) -> PublishBatch:
        """Block until every message of the batch has an outcome; raises PublishFailed after
        ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise PublishFailed(f"batch: outcomes still pending after {timeout} s")
        return self


@dataclass(slots=True)
class _Item:
    message: OutgoingMessage
    on_outcome: Outcome
    properties: Any = None  # sealed (encoded once) in the caller's thread
    error: AmqpLabError | None = None  # refused before sending
    tries: int = 0
    sent_at: float = 0.0  # time.perf_counter() of its last basic.publish
    returned: bool = False  # a basic.return for this publish arrived (before its ack)
    closes: int = 0  # unexplained channel closes this message was in flight for


def _outcome_name(error: AmqpLabError | None) -> str:
    """A publish outcome for the observer: confirmed, unroutable, nacked or failed."""
    if error is None:
        return "confirmed"
    if isinstance(error, MessageUnroutable):
        return "unroutable"
    return "nacked" if isinstance(error, MessageNacked) else "failed"


_MESSAGE_SIZE = re.compile(r"message size (\d+)")


class PipelinedPublisher:
    """``window``: most messages unconfirmed at once; ``max_attempts``: publishes of one message
    when nacked; ``base`` / ``cap``: backoff seconds for nack retries and reconnects;
    ``observer`` (e.g. :class:`amqp_lab.observability.metrics.PublisherMetrics`): outcomes,
    confirm latencies, blocked periods and reconnects. A message handed over inside a span
    carries that span's W3C trace context (``traceparent``); no span per message is made."""

    def __init__(
        self,
        settings: BrokerSettings,
        window: int = 500,
        max_attempts: int = 5,
        base: float = 0.1,
        cap: float = 5.0,
        max_reconnects: int = 10,
        observer: PublisherObserver = NO_PUBLISHER_OBSERVER,
    ) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.settings = settings
        self.observer = observer = guarded(observer)
        self._blocked = BlockedTime(observer.blocked)
        self.window = window
        self.max_attempts = max_attempts
        self.base, self.cap = base, cap
        self.max_reconnects = max_reconnects
        self._in_flight = 0  # handed over and not yet resolved; at most ``window``
        self._room = threading.Condition()
        self._incoming: collections.deque[_Item] = collections.deque()
        self._outstanding: collections.deque[_Item] = collections.deque()  # handed over, not sent
        self._unconfirmed: collections.OrderedDict[int, _Item] = collections.OrderedDict()
        self._waiting: dict[int, _Item] = {}  # nacked, a retry scheduled (by id)
        self._wake_pending = threading.Event()
        self._closing = False
        self._connection: Any = None
        self._channel: Any = None
        self._tag = 0
        self._ready = threading.Event()
        self._failure: AmqpLabError | None = None
        self.reconnects = 0
        self.channel_closes = 0  # channels the broker closed (a 404, 403, 406...)
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

    # --- caller side (any thread) ------------------------------------------------------------
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

        self._hand_over([_Item(message, settle)])
        return future

    def publish_each(self, messages: list[tuple[OutgoingMessage, Outcome]]) -> None:
        """Hand over every ``(message, callback)`` pair at once, each ``callback(message,
        error)`` called on the I/O thread with its own outcome, without a Future per message
        (the outbox relay's path); blocks while the window is full. A callback must not
        publish: it runs on the I/O thread, which alone frees window room."""
        chunk = max(1, self.window // 4)
        items = [_Item(message, callback) for message, callback in messages]
        for i in range(0, len(items), chunk):
            self._hand_over(items[i : i + chunk])

    def publish(self, message: OutgoingMessage, timeout: float | None = 60) -> None:
        """Publish and wait for this message's outcome; raises it (see the module doc)."""
        self.publish_async(message).result(timeout)

    def publish_many(self, messages: list[OutgoingMessage]) -> PublishBatch:
        """Hand over every message, pipelined and window-bounded; ``.wait()`` on the result."""
        batch = PublishBatch(len(messages))
        chunk = max(1, self.window // 4)
        for i in range(0, len(messages), chunk):
            self._hand_over([_Item(m, batch._record) for m in messages[i : i + chunk]])
        return batch

    def flush(self, timeout: float | None = 120) -> None:
        """Wait until every message handed over so far has an outcome (or ``timeout`` s)."""
        with self._room:
            if not self._room.wait_for(lambda: self._in_flight == 0, timeout):
                raise PublishFailed(f"flush: outcomes still pending after {timeout} s")

    def _hand_over(self, items: list[_Item]) -> None:
        for item in items:
            if not item.message.message_id:
                raise ValueError("every message needs a message_id")
            item.message = with_current_context(item.message)
            try:
                item.properties = item.message.sealed_properties()
            except UnencodableMessage as e:
                item.error = e  # resolved on the I/O thread, never sent
        if self._failure is not None:
            raise self._failure
        with self._room:
            while not self._room.wait_for(
                lambda: self._in_flight + len(items) <= self.window, timeout=1.0
            ):
                if self._failure is not None or not self._thread.is_alive():
                    raise self._failure or PublishFailed("the publisher's I/O thread stopped")
            self._in_flight += len(items)
        self._incoming.extend(items)
        if not self._wake_pending.is_set():
            self._wake_pending.set()
            self._ioloop.add_callback_threadsafe(self._on_wake)

    def _resolve(self, outcomes: list[tuple[_Item, AmqpLabError | None]]) -> None:
        """Deliver outcomes, then free their window slots with one lock round trip."""
        try:
            for item, error in outcomes:
                self.observer.outcome(item.message.exchange, _outcome_name(error))
                try:
                    item.on_outcome(item.message, error)
                except Exception:  # a caller's callback must not kill the I/O thread
                    log.exception(
                        "outcome callback for message_id=%s raised", item.message.message_id
                    )
        finally:
            with self._room:
                self._in_flight -= len(outcomes)
                if self._in_flight <= self.window // 2:
                    self._room.notify_all()

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

    # --- I/O thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        addresses = self.settings.addresses()
        order = address_order(len(addresses))
        attempt = 0
        while not self._closing:
            self._channel_was_open = False
            address = addresses[order[attempt % len(order)]]  # the next node on each reconnect
            attempt += 1
            try:
                self._connection = pika.SelectConnection(
                    connection_parameters(address),
                    on_open_callback=self._on_connection_open,
                    on_open_error_callback=self._on_open_error,
                    on_close_callback=self._on_connection_closed,
                    custom_ioloop=self._ioloop,
                )
            except (OSError, ValueError) as e:
                self._failure = PublishFailed(f"bad connection settings: {e}")
                self._ready.set()
                return
            self._ioloop.start()
            if self._closing:
                return
            failures = 0 if self._channel_was_open else failures + 1
            if failures >= self.max_reconnects or self._failure is not None:
                self._failure = self._failure or PublishFailed(
                    f"could not reconnect after {failures} attempts at {self.settings.masked_url}"
                )
                self._ready.set()
                self._fail_all(self._failure)
                return
            self.reconnects += 1
            self.observer.reconnected()
            time.sleep(full_jitter(failures, self.base, self.cap))

    def _on_connection_open(self, connection: Any) -> None:
        self._blocked.watch(connection)
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, connection: Any, error: BaseException) -> None:
        translated = translate(error, self.settings)
        if isinstance(translated, AuthenticationFailed | VhostAccessDenied):
            self._failure = translated  # retrying cannot help
        log.warning("publisher connection failed: %s", translated)
        self._ioloop.stop()

    def _on_connection_closed(self, connection: Any, reason: BaseException) -> None:
        self._channel = None
        self._blocked.closed()
        if isinstance(reason, pe.ConnectionBlockedTimeout):
            self._fail_all(
                BrokerBlocked(
                    "broker kept the connection blocked (resource alarm) longer than "
                    f"{self.settings.blocked_connection_timeout} s"
                )
            )
        elif not self._closing:
            log.warning("publisher connection closed (%s); reconnecting", reason)
            self._requeue_unconfirmed()
        self._ioloop.stop()

    def _on_channel_open(self, channel: Any) -> None:
        self._channel = channel
        self._channel_was_open = True
        self._tag = 0
        channel.add_on_return_callback(self._on_return)
        channel.add_on_close_callback(self._on_channel_closed)
        channel.confirm_delivery(self._on_confirm, callback=self._on_confirm_select_ok)

    def _on_confirm_select_ok(self, _frame: Any) -> None:
        self._ready.set()
        self._send()

    def _on_channel_closed(self, channel: Any, reason: BaseException) -> None:
        self._channel = None
        if self._closing or self._connection is None or not self._connection.is_open:
            return
        self.channel_closes += 1
        code = getattr(reason, "reply_code", 0)
        text = getattr(reason, "reply_text", str(reason))
        error: AmqpLabError = channel_error(code, text)
        culprits = self._culprits(text)
        outcomes: list[tuple[_Item, AmqpLabError | None]] = [
            (self._unconfirmed.pop(t), error) for t in culprits
        ]
        for tag, item in list(self._unconfirmed.items()):
            if not culprits:
                item.closes += 1
            if item.closes > 1:  # republished once already, and the channel died again
                outcomes.append((self._unconfirmed.pop(tag), error))
        self._resolve(outcomes)
        self._requeue_unconfirmed()
        self._channel_reopens += 1
        if self._channel_reopens > MAX_CHANNEL_REOPENS:
            self._failure = PublishFailed(
                f"channel closed {self._channel_reopens} times in a row, last: {code} {text}"
            )
            self._fail_all(self._failure)
            self._connection.close()
            return
        self._connection.channel(on_open_callback=self._on_channel_open)

    def _culprits(self, reply_text: str) -> list[int]:
        """The unconfirmed publishes a channel.close reply names: those to the exchange it
        names (404 NOT_FOUND, 403 ACCESS_REFUSED), or the first whose body has the size a 406
        names. Empty when the reply names none of them."""
        named = [
            tag
            for tag, item in self._unconfirmed.items()
            if f"exchange '{item.message.exchange}'" in reply_text
        ]
        if named:
            return named
        size = _MESSAGE_SIZE.search(reply_text)
        if size is not None:
            for tag, item in self._unconfirmed.items():
                if len(item.message.body) == int(size.group(1)):
                    return [tag]
        return []

    def _on_wake(self) -> None:
        self._wake_pending.clear()
        while self._incoming:
            self._outstanding.append(self._incoming.popleft())
        self._send()

    def _send(self) -> None:
        channel = self._channel
        while channel is not None and channel.is_open and self._outstanding:
            item = self._outstanding.popleft()
            if item.error is not None:
                self._resolve([(item, item.error)])
                continue
            m = item.message
            item.tries += 1
            item.returned = False
            item.sent_at = time.perf_counter()
            channel.basic_publish(m.exchange, m.routing_key, m.body, item.properties, True)
            self._tag += 1
            self._unconfirmed[self._tag] = item

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        """Mark the publish this basic.return is for: the earliest unconfirmed one, not yet
        returned, with the same exchange, routing key and message_id (returns arrive in publish
        order, each before its own ack)."""
        key = (method.exchange, method.routing_key, properties.message_id)
        for item in self._unconfirmed.values():
            m = item.message
            if not item.returned and (m.exchange, m.routing_key, m.message_id) == key:
                item.returned = True
                return

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        nacked = isinstance(method, pika.spec.Basic.Nack)
        outcomes: list[tuple[_Item, AmqpLabError | None]] = []
        for item in self._confirmed_items(tag, method.multiple):
            if item.returned:
                outcomes.append((item, outcome_error(Reply.RETURNED, item.message)))
            elif not nacked:
                outcomes.append((item, None))
                self._channel_reopens = 0
                self.observer.confirmed_after(
                    item.message.exchange, time.perf_counter() - item.sent_at
                )
            elif item.tries < self.max_attempts:
                wait = full_jitter(item.tries - 1, self.base, self.cap, random.uniform)
                self._waiting[id(item)] = item
                self._ioloop.call_later(wait, lambda i=item: self._retry(i))
            else:
                outcomes.append((item, outcome_error(Reply.NACKED, item.message, tries=item.tries)))
        self._resolve(outcomes)

    def _confirmed_items(self, tag: int, multiple: bool) -> list[_Item]:
        """Pop the items a basic.ack/nack covers: every tag <= ``tag`` when ``multiple``.
        Tags are sent in increasing order, so they come off the front: O(1) per message."""
        if not multiple:
            item = self._unconfirmed.pop(tag, None)
            return [] if item is None else [item]
        items = []
        while self._unconfirmed:
            first = next(iter(self._unconfirmed))
            if first > tag:
                break
            items.append(self._unconfirmed.pop(first))
        return items

    def _retry(self, item: _Item) -> None:
        if self._waiting.pop(id(item), None) is None:
            return  # resolved meanwhile (the publisher failed or closed)
        self._outstanding.appendleft(item)
        self._send()

    def _requeue_unconfirmed(self) -> None:
        """Put every unconfirmed message back at the front, in order, to be sent again - but
        one already sent ``max_attempts`` times fails instead: a message that kills every
        connection or channel it is sent on (a frame the broker refuses) must not be
        republished forever."""
        spent: list[tuple[_Item, AmqpLabError | None]] = []
        for _, item in sorted(self._unconfirmed.items(), reverse=True):
            if item.tries >= self.max_attempts:
                detail = "each time the connection or channel closed before the broker confirmed"
                spent.append(
                    (item, outcome_error(Reply.LOST, item.message, tries=item.tries, detail=detail))
                )
            else:
                self._outstanding.appendleft(item)
        self._unconfirmed.clear()
        if spent:
            self._resolve(spent)

    def _fail_all(self, error: AmqpLabError) -> None:
        pending = [
            *self._unconfirmed.values(),
            *self._outstanding,
            *self._incoming,
            *self._waiting.values(),  # nacked, waiting for their retry
        ]
        self._waiting.clear()
        self._unconfirmed.clear()
        self._outstanding.clear()
        self._incoming.clear()
        self._resolve([(item, error) for item in pending])

    def _close_connection(self) -> None:
        if self._connection is not None and self._connection.is_open:
            self._connection.close()
        else:
            self._ioloop.stop()
