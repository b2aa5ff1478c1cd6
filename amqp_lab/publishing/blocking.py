"""Confirming publisher: publisher confirms + mandatory + persistent + message_id, always.

Each :meth:`Publisher.publish` ends in exactly one outcome: it returns once the broker confirmed
the message (basic.ack), or raises

* :class:`~amqp_lab.errors.MessageUnroutable` - basic.return (mandatory): no queue is bound for
  the routing key; not retried (pika #543: without mandatory the broker would ack and drop it);
* :class:`~amqp_lab.errors.UnencodableMessage` - a property or header the broker would refuse
  by closing the channel, or AMQP cannot carry; found before sending, not retried;
* :class:`~amqp_lab.errors.MessageNacked` - basic.nack on every attempt;
* :class:`~amqp_lab.errors.PublishFailed` - the connection kept failing until retries ran out;
* a confirm that does not come within ``confirm_timeout`` seconds (a node on the minority side
  of a partition keeps the connection and its heartbeats alive and confirms nothing) drops the
  connection (:mod:`amqp_lab.publishing.confirm_deadline`): retried as a lost connection;
* :class:`~amqp_lab.errors.BrokerBlocked` - connection.blocked (memory or disk alarm) for longer
  than ``blocked_connection_timeout`` (pika #764: otherwise a publisher hangs); not retried;
* :class:`~amqp_lab.errors.NotFound` / ``AccessRefused`` - the exchange does not exist (404) or
  the user may not write to it (403): the broker closes the channel, the publisher replaces it
  and raises at that very publish (pika #971), not retried;
* ``AuthenticationFailed`` / ``VhostAccessDenied`` - not retried.

Nacks and lost connections are retried with exponential backoff, full jitter and a cap
(tenacity's ``wait_random_exponential``), republishing the same message_id: a retry after a lost
confirm may duplicate the message, which the consumer's de-duplication absorbs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika.exceptions as pe
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
)

from amqp_lab.connection import BlockedTime, close_quietly, connect, translate
from amqp_lab.errors import (
    BrokerUnavailable,
    ConnectionLost,
    MessageNacked,
    MessageUnroutable,
)
from amqp_lab.message import OutgoingMessage
from amqp_lab.observability.guard import guarded
from amqp_lab.observability.tracing import publish_span
from amqp_lab.publishing.confirm import Reply, outcome_error, publish_and_wait
from amqp_lab.publishing.confirm_deadline import DEFAULT_CONFIRM_TIMEOUT, confirm_deadline
from amqp_lab.publishing.confirm_watch import ConfirmWatch
from amqp_lab.publishing.observer import NO_PUBLISHER_OBSERVER, PublisherObserver
from amqp_lab.retry.policy import Backoff
from amqp_lab.settings import BrokerSettings

__all__ = [
    "PublishRetry",
    "Publisher",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishRetry:
    """Retry policy for nacks and lost connections: at most ``max_attempts`` publishes of one
    message, waiting ``uniform(0, min(cap, base * 2**n))`` seconds before retry n."""

    max_attempts: int = 5
    base: float = 0.2
    cap: float = 5.0

    @property
    def backoff(self) -> Backoff:
        """The wait between publishes: ``base`` and ``cap`` seconds, full jitter."""
        return Backoff(self.base, self.cap)


class _Nacked(Exception):
    pass


class Publisher:
    """A confirming publisher on one connection and channel, opened lazily and replaced after a
    failure. Not thread-safe (pika's BlockingConnection is not). ``observer`` (e.g.
    :class:`amqp_lab.exporters.metrics.PublisherMetrics`) hears of each outcome, confirm
    latency, blocked period and reconnect. Each publish is a ``publish`` span whose W3C trace
    context the message carries (``traceparent`` header; :mod:`amqp_lab.observability.tracing`).
    ``confirm_timeout``: seconds a publish waits for its confirm, time blocked by the broker
    not counted, before the connection is dropped and the publish retried (None: no limit).
    Raises ValueError for a ``confirm_timeout`` <= 0."""

    def __init__(
        self,
        settings: BrokerSettings,
        retry: PublishRetry | None = None,
        sleep: Callable[[float], None] = time.sleep,
        observer: PublisherObserver = NO_PUBLISHER_OBSERVER,
        confirm_timeout: float | None = DEFAULT_CONFIRM_TIMEOUT,
    ) -> None:
        ConfirmWatch(confirm_timeout)  # ValueError now, not at the first publish
        self.confirm_timeout = confirm_timeout
        self.settings = settings
        self.retry = retry or PublishRetry()
        self._sleep = sleep
        self.observer = observer = guarded(observer)
        self._blocked = BlockedTime(observer.blocked)
        self._connections = 0
        self._connection: Any = None
        self._channel: Any = None
        self.attempts_made = 0  # publishes sent, retries included (for tests and reports)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (a later publish opens a new one)."""
        close_quietly(self._connection)
        self._blocked.closed()
        self._connection = self._channel = None

    def connect(self) -> None:
        """Open the connection and its confirm channel now instead of at the first publish.
        Raises BrokerConnectionError subclasses (not retried)."""
        self._ensure_channel()

    def _ensure_channel(self) -> Any:
        if self._connection is None or not self._connection.is_open:
            self.close()
            self._connection = connect(self.settings)
            self._connections += 1
            if self._connections > 1:
                self.observer.reconnected()
            self._blocked.watch(self._connection)
        if self._channel is None or not self._channel.is_open:
            try:
                self._channel = self._connection.channel()
                self._channel.confirm_delivery()
            except Exception as e:
                self.close()
                raise translate(e, self.settings) from e
        return self._channel

    def _publish_once(self, message: OutgoingMessage, properties: Any) -> None:
        channel = self._ensure_channel()
        self.attempts_made += 1
        started = time.perf_counter()
        try:
            blocked = self._blocked
            with confirm_deadline(self._connection, self.confirm_timeout, lambda: blocked.blocked):
                reply = publish_and_wait(channel, message, properties)
        except pe.ChannelClosedByBroker as e:
            self._channel = None  # replace the dead channel; the connection is still good
            raise translate(e, self.settings) from e
        except Exception as e:
            self.close()
            raise translate(e, self.settings) from e
        if reply is Reply.ACK:
            self.observer.confirmed_after(message.exchange, time.perf_counter() - started)
        if reply is Reply.NACKED:
            raise _Nacked()
        error = outcome_error(reply, message)
        if error is not None:
            raise error

    def publish(self, message: OutgoingMessage) -> None:
        """Publish ``message`` and wait for its publisher confirm; see the module doc for the
        errors raised. Returns only when the broker has taken responsibility for it."""
        if not message.message_id:
            raise ValueError("every message needs a message_id")
        with publish_span(message) as (_, traced):
            try:
                self._publish(traced)
            except MessageUnroutable:
                self.observer.outcome(message.exchange, "unroutable")
                raise
            except MessageNacked:
                self.observer.outcome(message.exchange, "nacked")
                raise
            except Exception:
                self.observer.outcome(message.exchange, "failed")
                raise
        self.observer.outcome(message.exchange, "confirmed")

    def _publish(self, message: OutgoingMessage) -> None:
        properties = message.sealed_properties()  # UnencodableMessage before anything is sent

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            log.warning(
                "message_id=%s publish attempt %d failed (%s); retrying in %.2fs",
                message.message_id,
                state.attempt_number,
                "nacked" if isinstance(error, _Nacked) else error,
                state.upcoming_sleep,
            )

        retrying = Retrying(
            stop=stop_after_attempt(self.retry.max_attempts),
            wait=self.retry.backoff.tenacity(),
            retry=retry_if_exception_type((_Nacked, ConnectionLost, BrokerUnavailable)),
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            retrying(self._publish_once, message, properties)
        except _Nacked as e:
            tries = self.retry.max_attempts
            raise outcome_error(Reply.NACKED, message, tries=tries) or e from e
        except (ConnectionLost, BrokerUnavailable) as e:
            tries = self.retry.max_attempts
            raise outcome_error(Reply.LOST, message, tries=tries, detail=str(e)) or e from e
