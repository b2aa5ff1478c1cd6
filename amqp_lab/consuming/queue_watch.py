"""The plain consumer's view of its queue and channel (pika boundary helpers): waiting for the
queue to exist, asking whether it outlived a broker cancel, and hearing of a cancel or a close
the moment pika reads it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pika.exceptions as pe

from amqp_lab.errors import QueueNotFound

__all__ = ["ChannelWatch", "await_queue", "on_broker_cancel", "on_channel_closed", "queue_exists"]

log = logging.getLogger(__name__)


def await_queue(
    connection: Any,
    queue: str,
    vhost: str,
    *,
    bound: float,
    consumed: bool,
    stopping: Callable[[], bool],
) -> bool:
    """queue.declare(passive) until ``queue`` exists (True); False when ``stopping()`` turns
    true meanwhile. Raises QueueNotFound after ``bound`` seconds - naming the fix at start, or
    the deletion once it had been ``consumed`` from; other channel errors as pika raised them."""
    deadline = time.monotonic() + bound
    while True:
        channel = connection.channel()
        try:
            channel.queue_declare(queue, passive=True)
        except pe.ChannelClosedByBroker as e:
            if e.reply_code != 404:
                raise
            if stopping():
                return False
            if time.monotonic() >= deadline:
                if consumed:
                    message = (
                        f"queue {queue!r} in vhost {vhost!r} is gone (the broker cancelled the "
                        f"consumer) and did not come back within {bound:g} s"
                    )
                else:
                    message = (
                        f"queue {queue!r} does not exist in vhost {vhost!r}: declare it "
                        "(scripts/setup_topology.py --topology FILE, or amqp-lab-topology, "
                        "applies a topology), or wait for it (--wait-for-queue SECONDS)"
                    )
                raise QueueNotFound(message, queue, vhost) from e
            connection.sleep(0.5)
            continue
        channel.close()
        return True


def queue_exists(connection: Any, queue: str) -> bool:
    """Whether ``queue`` exists: queue.declare(passive) on a channel of its own; False on 404
    (deleted, or its node down). Any other refusal says nothing about the messages: True,
    the safe side (keep them in the queue), and the resubscription finds out."""
    probe = connection.channel()
    try:
        probe.queue_declare(queue, passive=True)
    except pe.ChannelClosedByBroker as e:
        return bool(e.reply_code != 404)
    probe.close()
    return True


def on_broker_cancel(channel: Any, callback: Callable[[], None]) -> None:
    """Call ``callback`` on the I/O thread as soon as the broker's basic.cancel for a consumer
    of ``channel`` (a pika BlockingChannel) is read. pika's consume generator only ends after
    yielding every delivery that arrived before the cancel, and BlockingChannel's own
    ``add_on_cancel_callback`` is not called for a generator's consumer; the underlying
    channel's is (pika 1.x: ``Channel.add_on_cancel_callback``, for the broker's cancel only)."""
    impl = getattr(channel, "_impl", None)
    if impl is not None:
        impl.add_on_cancel_callback(lambda _frame: callback())


def on_channel_closed(channel: Any, callback: Callable[[BaseException], None]) -> None:
    """Call ``callback(reason)`` on the I/O thread when ``channel`` (a pika BlockingChannel)
    closes - BlockingChannel has no close callback of its own; its underlying channel has."""
    impl = getattr(channel, "_impl", None)
    if impl is not None:
        impl.add_on_close_callback(lambda _channel, reason: callback(reason))


class ChannelWatch:
    """What the broker did to the consuming channel of one connection, heard on the I/O thread
    the moment pika reads it (:meth:`watch`): ``cancelled`` (its basic.cancel), ``closed`` (the
    reason when the broker closed the channel: a 406 consumer timeout up to 4.2, for the
    reconnect line); and, once asked after a cancel, whether the queue outlived it."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.cancelled = False
        self.closed: BaseException | None = None
        self._outlived: bool | None = None

    def watch(self, channel: Any) -> None:
        """Start hearing ``channel``'s cancel and close (a new channel: nothing heard yet)."""
        self.cancelled, self.closed, self._outlived = False, None, None
        on_broker_cancel(channel, self._cancel)
        on_channel_closed(channel, self._close)

    def _cancel(self) -> None:
        self.cancelled = True

    def _close(self, reason: BaseException) -> None:
        if isinstance(reason, pe.ChannelClosedByBroker):
            self.closed = reason

    def hand_back_after_cancel(
        self,
        connection: Any,
        deliveries: list[tuple[Any, Any, bytes]],
        hand_back: Callable[[int], None],
    ) -> bool:
        """After a broker cancel, while the queue still exists (asked once per cancel, on a
        channel of its own: :func:`queue_exists`): ``hand_back`` every delivery tag instead of
        starting it, and say so (True). The cancel was then a quorum queue's consumer timeout
        (RabbitMQ 4.3+), which has returned them already: running them would run them twice.
        When the queue is gone they run: they may be the only copies left."""
        if not self.cancelled:
            return False
        if self._outlived is None:
            self._outlived = queue_exists(connection, self.queue)
        if not self._outlived:
            return False
        for method, _, _ in deliveries:
            hand_back(method.delivery_tag)
        log.warning(
            "the broker cancelled the consumer of %r: %d delivery(ies) received before the "
            "cancel go back to the queue without running",
            self.queue,
            len(deliveries),
        )
        return True
