"""The plain consumer's view of its queue and channel (pika boundary helpers): waiting for the
queue to exist, asking whether it outlived a broker cancel, and hearing of a cancel or a close
the moment pika reads it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika.exceptions as pe

from amqp_lab.errors import QueueNotFound

__all__ = ["await_queue", "on_broker_cancel", "on_channel_closed", "queue_exists"]


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
