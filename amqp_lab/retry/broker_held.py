"""Broker-held delayed retries (pure): which wait queue, how long to wait, the bound.

After failure n (n = 1, 2, ...) a message is republished with ``attempts = n`` into wait queue
n (``Names.wait_queue(n)``, ``q:tasks:wait:n`` in the lab topology) with a per-message TTL
(``expiration``, milliseconds) of ``uniform(0, min(cap, base * 2**(n-1)))`` seconds. The wait
queue's policy dead-letters expired messages through the retry exchange back to the work
queue.

A per-message TTL only fires at the head of a queue (https://www.rabbitmq.com/docs/ttl,
rabbitmq-server #2007): a 10 s message blocks a 1 s one behind it. One wait queue per attempt
number means every message in queue n has a wait within the same bound, so no message waits
longer than its own attempt's capped bound (plus the broker's expiry tolerance).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from amqp_lab.message import (
    ATTEMPTS_HEADER,
    FIRST_SEEN_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    REPLAYED_PROPERTIES,
    OutgoingMessage,
    original_destination,
    user_headers,
)
from amqp_lab.retry.policy import RetryPolicy, capped

__all__ = [
    "expiration_ms",
    "retry_copy",
    "retry_wait",
    "wait_bound",
]


def wait_bound(policy: RetryPolicy, attempts: int) -> float:
    """Upper bound in seconds of the wait after failure ``attempts``: min(cap, base*2**(n-1))."""
    return capped(attempts - 1, policy.base, policy.cap)


def retry_wait(
    policy: RetryPolicy,
    attempts: int,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """The full-jitter wait in seconds after failure ``attempts``."""
    return policy.backoff.wait(attempts - 1, uniform)


def expiration_ms(seconds: float) -> str:
    """AMQP ``expiration`` property: a string of whole milliseconds (>= 0)."""
    return str(max(0, round(seconds * 1000)))


def retry_copy(
    *,
    body: bytes,
    message_id: str,
    properties: dict[str, Any],
    headers: dict[Any, Any],
    exchange: str,
    routing_key: str,
    wait_queue: str,
    attempts: int,
    first_seen_at: str,
    wait: float,
) -> OutgoingMessage:
    """The copy of a failed delivery for ``wait_queue`` (the one of failure ``attempts``),
    published to the default exchange with a per-message TTL of ``wait`` seconds. It keeps the
    body, the publisher's headers (types and bytes unchanged) and properties, and carries our
    bookkeeping: ``attempts``, ``first_seen_at``, and the **original** exchange and routing
    key (set on the first hop from the delivery's, kept after), so a DLQ record written after
    any number of hops names where the message was first published. The broker's x-death
    family is not copied."""
    original_exchange, original_key = original_destination(headers, exchange, routing_key)
    copy_headers = user_headers(headers)
    copy_headers.update(
        {
            ATTEMPTS_HEADER: attempts,
            FIRST_SEEN_HEADER: first_seen_at,
            ORIGINAL_EXCHANGE_HEADER: original_exchange,
            ORIGINAL_ROUTING_KEY_HEADER: original_key,
        }
    )
    kept = {k: v for k, v in properties.items() if k in REPLAYED_PROPERTIES}
    return OutgoingMessage(
        body=body,
        message_id=message_id,
        exchange="",
        routing_key=wait_queue,
        content_type=kept.pop("content_type", None),
        headers=copy_headers,
        expiration=expiration_ms(wait),
        **kept,
    )
