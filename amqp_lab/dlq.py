"""DLQ operations: browse without consuming, depth alert, and explicit replay.

Browsing takes each message with basic.get (no auto-ack) and then returns all of them with
basic.nack(multiple=True, requeue=True): RabbitMQ puts requeued messages back in their original
position (https://www.rabbitmq.com/docs/confirms#consumer-nacks-requeue), so listing changes
nothing but the redelivered flag. Nothing in amqp-lab consumes the DLQ automatically: if the
cause is still there, an automatic DLQ consumer is an infinite loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import open_channel, translate
from amqp_lab.dlq_record import DlqEntry, replay_message, view_of
from amqp_lab.errors import AmqpLabError
from amqp_lab.publisher import Publisher
from amqp_lab.settings import BrokerSettings

DLQ = "q:tasks:dlq"


@dataclass(frozen=True)
class _Held:
    delivery_tag: int
    entry: DlqEntry


@contextmanager
def _holding(
    settings: BrokerSettings, queue: str, limit: int | None
) -> Iterator[tuple[Any, list[_Held]]]:
    """basic.get up to ``limit`` messages (all when None) without acking; on exit nack the rest
    with requeue so they return to their place."""
    with open_channel(settings) as channel:
        held: list[_Held] = []
        try:
            while limit is None or len(held) < limit:
                method, properties, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                entry = view_of(body, properties.message_id, properties.type, properties.headers)
                held.append(_Held(method.delivery_tag, entry))
        except pe.ChannelClosedByBroker as e:
            raise translate(e, settings) from e
        try:
            yield channel, held
        finally:
            if channel.is_open:
                channel.basic_nack(0, multiple=True, requeue=True)


def browse(settings: BrokerSettings, queue: str = DLQ, limit: int | None = None) -> list[DlqEntry]:
    """The DLQ's messages, oldest first, left in the queue. Raises NotFound if it is missing."""
    with _holding(settings, queue, limit) as (_, held):
        return [h.entry for h in held]


def depth(settings: BrokerSettings, queue: str = DLQ) -> int:
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
    queue: str = DLQ,
    dry_run: bool = False,
    exchange: str | None = None,
    on_result: Callable[[ReplayResult], None] | None = None,
) -> list[ReplayResult]:
    """Republish the selected DLQ entries with confirms + mandatory (original payload, same
    message_id, attempts 0, x-death removed), and basic.ack each DLQ copy only after its replay
    was confirmed. A replay that fails (unroutable, nacked...) leaves its DLQ copy in place."""
    results: list[ReplayResult] = []
    with _holding(settings, queue, None) as (channel, held), Publisher(settings) as publisher:
        for item in held:
            if not select(item.entry):
                continue
            if dry_run:
                result = ReplayResult(item.entry, "would-replay")
            else:
                try:
                    publisher.publish(replay_message(item.entry, exchange))
                    channel.basic_ack(item.delivery_tag)
                    result = ReplayResult(item.entry, "replayed")
                except AmqpLabError as e:
                    result = ReplayResult(item.entry, "failed", str(e))
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
