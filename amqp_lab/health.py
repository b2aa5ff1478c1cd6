"""What ``mandatory`` cannot see: a work queue that is missing or has nobody consuming it.

``mandatory`` only reports a message that reached **no** queue. The work queue and the audit
queue are both bound to ``tasks`` with routing key ``task``: delete the work queue, and every
publish still reaches the audit queue, is confirmed, and nobody will ever process it. Stop every
worker, and messages pile up confirmed and unread. Neither is an error a publisher can see, so
it has to be watched: :func:`queue_health` reads the exact counts (queue.declare passive, no
management statistics lag) and :func:`health_problems` says what is wrong (pure).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pika.exceptions as pe

from amqp_lab.connection import open_channel, translate
from amqp_lab.outbox.status import OutboxStatus, outbox_problems
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings

__all__ = [
    "OutboxStatus",
    "QueueHealth",
    "health_problems",
    "outbox_health",
    "outbox_problems",
    "queue_health",
]


@dataclass(frozen=True)
class QueueHealth:
    """A queue now: ``exists``; ``messages`` ready; ``consumers`` subscribed (0 when missing)."""

    queue: str
    exists: bool
    messages: int = 0
    consumers: int = 0


def queue_health(settings: BrokerSettings, queue: str) -> QueueHealth:
    """queue.declare(passive=True) on ``queue`` in the URL's vhost. Raises
    BrokerConnectionError subclasses when the broker cannot be asked (not for a missing
    queue: that is ``exists=False``)."""
    with open_channel(settings) as channel:
        try:
            ok = channel.queue_declare(queue, passive=True).method
        except pe.ChannelClosedByBroker as e:
            if e.reply_code == 404:
                return QueueHealth(queue, exists=False)
            raise translate(e, settings) from e
        return QueueHealth(queue, True, int(ok.message_count), int(ok.consumer_count))


def outbox_health(outbox: str | Path, lock_timeout: float = 5.0) -> tuple[OutboxStatus, str]:
    """The outbox at ``outbox`` (a SQLite path or a PostgreSQL URL) now, and its location with
    the password masked; :func:`~amqp_lab.outbox.status.outbox_problems` says what is wrong.
    A relay that runs is no proof: rows can wait because every relay is down, the broker
    refuses them or the broker is unreachable, which only the outbox itself shows. Raises
    OutboxError / OutboxUnavailable when the database cannot be read - PostgreSQL: also when
    the table stays locked (a migration, ``LOCK TABLE``) past ``lock_timeout`` seconds, so a
    check never hangs on a lock."""
    store = OutboxStore(outbox, lock_timeout=lock_timeout)
    try:
        return store.status(), store.location
    finally:
        store.close()


def health_problems(
    work: QueueHealth,
    vhost: str,
    min_consumers: int = 1,
    dlq: QueueHealth | None = None,
    max_dlq_depth: int | None = None,
) -> list[str]:
    """Alert lines (empty when healthy): the work queue missing (confirmed publishes are
    reaching only the other bindings), fewer than ``min_consumers`` consumers, the DLQ deeper
    than ``max_dlq_depth``."""
    found: list[str] = []
    if not work.exists:
        found.append(
            f"work queue {work.queue!r} does not exist in vhost {vhost!r}: publishes are still "
            "confirmed when another queue takes the routing key, and nobody processes them"
        )
    elif work.consumers < min_consumers:
        found.append(
            f"work queue {work.queue!r} has {work.consumers} consumer(s), fewer than "
            f"{min_consumers}; {work.messages} message(s) waiting"
        )
    if dlq is not None and max_dlq_depth is not None:
        if not dlq.exists:
            found.append(f"DLQ {dlq.queue!r} does not exist in vhost {vhost!r}")
        elif dlq.messages > max_dlq_depth:
            found.append(f"DLQ {dlq.queue!r} holds {dlq.messages} (threshold {max_dlq_depth})")
    return found
