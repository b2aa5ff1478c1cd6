"""DLQ operations: browse without consuming, depth alert, explicit replay and delete.

Browsing takes each message with basic.get (no auto-ack) and then returns all of them with
basic.nack(multiple=True, requeue=True): RabbitMQ puts requeued messages back in their original
position (https://www.rabbitmq.com/docs/confirms#consumer-nacks-requeue), so listing changes
nothing but the redelivered flag. Nothing in amqp-lab consumes the DLQ automatically: if the
cause is still there, an automatic DLQ consumer is an infinite loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import open_channel, translate
from amqp_lab.dlq.view import DlqEntry, replay_message, view_of
from amqp_lab.errors import AmqpLabError
from amqp_lab.observability.tracing import replay_span
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings

__all__ = [
    "PROGRESS_EVERY",
    "DeleteResult",
    "ReplayResult",
    "browse",
    "delete",
    "depth",
    "replay",
]

PROGRESS_EVERY = 100


@dataclass(frozen=True)
class _Held:
    delivery_tag: int
    entry: DlqEntry


@contextmanager
def _holding(
    settings: BrokerSettings,
    queue: str,
    limit: int | None,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[Any, list[_Held]]]:
    """basic.get up to ``limit`` messages (all when None) without acking; on exit nack the rest
    with requeue so they return to their place. ``on_progress(n)`` every 100 messages."""
    with open_channel(settings) as channel:
        held: list[_Held] = []
        try:
            while limit is None or len(held) < limit:
                method, properties, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                entry = view_of(body, properties)
                held.append(_Held(method.delivery_tag, entry))
                if on_progress is not None and len(held) % PROGRESS_EVERY == 0:
                    on_progress(len(held))
        except pe.ChannelClosedByBroker as e:
            raise translate(e, settings) from e
        try:
            yield channel, held
        finally:
            if channel.is_open:
                channel.basic_nack(0, multiple=True, requeue=True)
                # A synchronous call on the same channel reaches the queue after the requeue,
                # so when this returns the messages are back (other connections see them).
                channel.queue_declare(queue, passive=True)


def browse(
    settings: BrokerSettings,
    queue: str,
    limit: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> list[DlqEntry]:
    """The DLQ's messages, oldest first, left in the queue. Raises NotFound if it is missing."""
    with _holding(settings, queue, limit, on_progress) as (_, held):
        return [h.entry for h in held]


def depth(settings: BrokerSettings, queue: str) -> int:
    """Messages in ``queue`` now, via queue.declare(passive=True) (exact, not lagging stats)."""
    with open_channel(settings) as channel:
        try:
            result = channel.queue_declare(queue, passive=True)
        except pe.ChannelClosedByBroker as e:
            raise translate(e, settings) from e
    return int(result.method.message_count)


@dataclass(frozen=True)
class ReplayResult:
    entry: DlqEntry
    status: str  # replayed | would-replay | failed
    detail: str = ""


def replay(
    settings: BrokerSettings,
    select: Callable[[DlqEntry], bool],
    *,
    queue: str,
    dry_run: bool = False,
    exchange: str | None = None,
    limit: int | None = None,
    rate: float | None = None,
    on_result: Callable[[ReplayResult], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[ReplayResult]:
    """Republish the selected DLQ entries (at most ``limit``, at most ``rate`` per second) with
    confirms + mandatory: original payload, same message_id, attempts 0, x-death removed. Each
    DLQ copy is basic.ack'ed only after its replay was confirmed; a failed replay (unroutable,
    nacked...) leaves it in place. Replaying a message_id twice cannot apply it twice: the
    consumer's dedup store skips a message_id it has already processed.

    Each replay is a ``replay <queue>`` span in the trace the record's headers carry, linked to
    it; the republished message carries that span's context, so the replayed run joins the
    original trace (:func:`amqp_lab.observability.tracing.replay_span`)."""
    results: list[ReplayResult] = []
    interval = 1.0 / rate if rate else 0.0
    with (
        _holding(settings, queue, None, on_progress) as (channel, held),
        Publisher(settings) as publisher,
    ):
        for item in held:
            if limit is not None and len(results) >= limit:
                break
            if not select(item.entry):
                continue
            if not item.entry.message_id:
                # our publisher and dedup both need an id: this one stays in the DLQ
                result = ReplayResult(item.entry, "failed", "no message_id: cannot be replayed")
            elif dry_run:
                result = ReplayResult(item.entry, "would-replay")
            else:
                if interval and results:
                    sleep(interval)
                try:
                    entry = item.entry
                    with replay_span(queue, entry.headers, entry.message_id):
                        publisher.publish(replay_message(entry, exchange))
                except AmqpLabError as e:
                    result = ReplayResult(item.entry, "failed", str(e))
                else:
                    try:
                        channel.basic_ack(item.delivery_tag)
                    except pe.AMQPError as e:  # e.g. consumer_timeout closed the DLQ channel
                        raise translate(e, settings) from e
                    result = ReplayResult(item.entry, "replayed")
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


@dataclass(frozen=True)
class DeleteResult:
    entry: DlqEntry
    status: str  # deleted | would-delete
    detail: str = ""


def delete(
    settings: BrokerSettings,
    select: Callable[[DlqEntry], bool],
    *,
    queue: str,
    dry_run: bool = False,
    limit: int | None = None,
    on_result: Callable[[DeleteResult], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> list[DeleteResult]:
    """Remove the selected DLQ entries (at most ``limit``) for good: basic.get every message
    without ack, basic.ack the selected ones, basic.nack(requeue) the rest back into place.
    ``on_result`` is called for each only after a synchronous call on the same channel
    returned, i.e. once the broker has processed the acks. Raises NotFound when ``queue`` is
    missing, ConnectionLost when the channel dies before the acks are known to be processed
    (then the unacked messages are back in the queue and nothing is reported deleted)."""
    results: list[DeleteResult] = []
    with _holding(settings, queue, None, on_progress) as (channel, held):
        for item in held:
            if limit is not None and len(results) >= limit:
                break
            if not select(item.entry):
                continue
            if dry_run:
                results.append(DeleteResult(item.entry, "would-delete"))
                continue
            try:
                channel.basic_ack(item.delivery_tag)
            except pe.AMQPError as e:
                raise translate(e, settings) from e
            results.append(DeleteResult(item.entry, "deleted"))
        if results and not dry_run:
            try:  # answered after the channel passed the acks on to the queue
                channel.queue_declare(queue, passive=True)
            except pe.AMQPError as e:
                raise translate(e, settings) from e
    if on_result is not None:
        for result in results:
            on_result(result)
    return results
