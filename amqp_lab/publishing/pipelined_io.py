"""The I/O thread of :class:`~amqp_lab.publishing.pipelined.PipelinedPublisher`: pika's
SelectConnection and its callbacks - connect (the next node of the address list on each
reconnect), confirm.select, send, basic.ack/nack and basic.return, a channel the broker
closed because of one message, the confirm timeout, connection.blocked - over the
:class:`~amqp_lab.publishing.in_flight.InFlight` bookkeeping. Everything here runs on that one
thread; callers reach it through ``InFlight.incoming`` and ``add_callback_threadsafe``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
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
    PublishFailed,
    VhostAccessDenied,
)
from amqp_lab.publishing.confirm import Reply, outcome_error
from amqp_lab.publishing.confirm_watch import ConfirmWatch
from amqp_lab.publishing.in_flight import InFlight, Pending, outcome_name
from amqp_lab.publishing.observer import PublisherObserver
from amqp_lab.retry.policy import full_jitter
from amqp_lab.settings import BrokerSettings

__all__ = ["MAX_CHANNEL_REOPENS", "PublisherIo"]

log = logging.getLogger("amqp_lab.publishing.pipelined")
MAX_CHANNEL_REOPENS = 5


class PublisherIo:
    """The I/O-thread half of PipelinedPublisher (its state is set by the publisher's
    ``__init__``; declared here for the type checker)."""

    settings: BrokerSettings
    observer: PublisherObserver
    window: int
    max_attempts: int
    base: float
    cap: float
    max_reconnects: int
    reconnects: int
    channel_closes: int
    nacks: int
    confirms_timed_out: int
    confirms_lost: int
    address: BrokerSettings | None
    _watch: ConfirmWatch
    _watching: int
    _timed_out: bool
    _blocked: BlockedTime
    _in_flight: int
    _room: threading.Condition
    _flight: InFlight
    _wake_pending: threading.Event
    _closing: bool
    _connection: Any
    _channel: Any
    _ready: threading.Event
    _failure: AmqpLabError | None
    _connecting: BrokerSettings | None
    _channel_reopens: int
    _channel_was_open: bool
    _ioloop: IOLoop

    def _resolve(self, outcomes: list[tuple[Pending, AmqpLabError | None]]) -> None:
        """Deliver outcomes, then free their window slots with one lock round trip."""
        try:
            for item, error in outcomes:
                self.observer.outcome(item.message.exchange, outcome_name(error))
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

    def _run(self) -> None:
        failures = 0
        addresses = self.settings.addresses()
        order = address_order(len(addresses))
        attempt = 0
        while not self._closing:
            self._channel_was_open = False
            address = addresses[order[attempt % len(order)]]  # the next node on each reconnect
            attempt += 1
            self._connecting = address
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
        self.address = self._connecting
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
        self.address = None
        self._watching += 1
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
            if not self._timed_out:
                self.confirms_lost += len(self._flight.unconfirmed)
            self._requeue_unconfirmed()
        self._timed_out = False
        self._ioloop.stop()

    def _on_channel_open(self, channel: Any) -> None:
        self._channel = channel
        self._channel_was_open = True
        self._flight.new_channel()
        channel.add_on_return_callback(self._on_return)
        channel.add_on_close_callback(self._on_channel_closed)
        channel.confirm_delivery(self._on_confirm, callback=self._on_confirm_select_ok)

    def _on_confirm_select_ok(self, _frame: Any) -> None:
        self._ready.set()
        self._watch.progress()
        self._watching += 1
        self._look_at_confirms(self._watching)
        self._send()

    def _look_at_confirms(self, watching: int) -> None:
        """Every ``ConfirmWatch.interval`` seconds while this connection lives: drop it when
        a confirm is overdue (it then counts as lost: see the module doc)."""
        if watching != self._watching or self._watch.interval is None:
            return  # another connection by now, or no timeout
        if not self._watch.overdue(self._flight.oldest_sent_at(), self._blocked.blocked):
            self._ioloop.call_later(self._watch.interval, lambda: self._look_at_confirms(watching))
            return
        self._timed_out = True
        self.confirms_timed_out += len(self._flight.unconfirmed)
        text = f"no publisher confirm within {self._watch.timeout} s"
        log.warning(
            "publisher: %s for %d messages; dropping the connection",
            text,
            len(self._flight.unconfirmed),
        )
        terminate = getattr(self._connection, "_terminate_stream", None)  # pika 1.3-1.4 internal
        if terminate is not None:
            terminate(pe.StreamLostError(text))  # a frozen node would never answer a close
        else:
            self._connection.close()

    def _unblocked(self, seconds: float) -> None:
        """connection.unblocked (or the connection ended): restart the confirm clock."""
        self._watch.progress()
        self.observer.blocked(seconds)

    def _on_channel_closed(self, channel: Any, reason: BaseException) -> None:
        self._channel = None
        if self._closing or self._connection is None or not self._connection.is_open:
            return
        self.channel_closes += 1
        code = getattr(reason, "reply_code", 0)
        text = getattr(reason, "reply_text", str(reason))
        error: AmqpLabError = channel_error(code, text)
        culprits = self._flight.culprits(text)
        outcomes: list[tuple[Pending, AmqpLabError | None]] = [
            (self._flight.unconfirmed.pop(t), error) for t in culprits
        ]
        for tag, item in list(self._flight.unconfirmed.items()):
            if not culprits:
                item.closes += 1
            if item.closes > 1:  # republished once already, and the channel died again
                outcomes.append((self._flight.unconfirmed.pop(tag), error))
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

    def _on_wake(self) -> None:
        self._wake_pending.clear()
        self._flight.take_incoming()
        self._send()

    def _send(self) -> None:
        channel = self._channel
        while channel is not None and channel.is_open and self._flight.outstanding:
            item = self._flight.outstanding.popleft()
            if item.error is not None:
                self._resolve([(item, item.error)])
                continue
            m = item.message
            item.tries += 1
            item.returned = False
            item.sent_at = time.perf_counter()
            channel.basic_publish(m.exchange, m.routing_key, m.body, item.properties, True)
            self._flight.sent(item)

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        """A basic.return: mark its publish (see :meth:`InFlight.mark_returned`)."""
        self._flight.mark_returned(method.exchange, method.routing_key, properties.message_id)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        nacked = isinstance(method, pika.spec.Basic.Nack)
        outcomes: list[tuple[Pending, AmqpLabError | None]] = []
        self._watch.progress()
        items = self._flight.confirmed(tag, method.multiple)
        self.nacks += len(items) if nacked else 0
        for item in items:
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
                self._flight.waiting[id(item)] = item
                self._ioloop.call_later(wait, lambda i=item: self._retry(i))
            else:
                outcomes.append((item, outcome_error(Reply.NACKED, item.message, tries=item.tries)))
        self._resolve(outcomes)

    def _retry(self, item: Pending) -> None:
        if self._flight.waiting.pop(id(item), None) is None:
            return  # resolved meanwhile (the publisher failed or closed)
        self._flight.outstanding.appendleft(item)
        self._send()

    def _requeue_unconfirmed(self) -> None:
        """Every unconfirmed message back to the front, to be sent again; one sent
        ``max_attempts`` times fails instead (:meth:`InFlight.requeue_unconfirmed`)."""
        spent = self._flight.requeue_unconfirmed(self.max_attempts)
        if spent:
            self._resolve(spent)

    def _fail_all(self, error: AmqpLabError) -> None:
        self._resolve([(item, error) for item in self._flight.take_all()])

    def _close_connection(self) -> None:
        if self._connection is not None and self._connection.is_open:
            self._connection.close()
        else:
            self._ioloop.stop()
