"""Broker-held delayed retries (pure): which wait queue, how long to wait, the bound.

After failure n (n = 1, 2, ...) a message is republished with ``attempts = n`` into wait queue
n (``q:tasks:wait:n``) with a per-message TTL (``expiration``, milliseconds) of
``uniform(0, min(cap, base * 2**(n-1)))`` seconds. The wait queue's policy dead-letters expired
messages through ``tasks.retry`` back to ``q:tasks``.

A per-message TTL only fires at the head of a queue (https://www.rabbitmq.com/docs/ttl,
rabbitmq-server #2007): a 10 s message blocks a 1 s one behind it. One wait queue per attempt
number means every message in queue n has a wait within the same bound, so no message waits
longer than its own attempt's capped bound (plus the broker's expiry tolerance).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from amqp_lab.backoff import capped, full_jitter
from amqp_lab.settlement import RetryPolicy


def wait_queue_name(queue: str, attempts: int) -> str:
    """The wait queue holding messages of ``queue`` after failure ``attempts`` (1-based)."""
    return f"{queue}:wait:{attempts}"


def wait_bound(policy: RetryPolicy, attempts: int) -> float:
    """Upper bound in seconds of the wait after failure ``attempts``: min(cap, base*2**(n-1))."""
    return capped(attempts - 1, policy.base, policy.cap)


def retry_wait(
    policy: RetryPolicy,
    attempts: int,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """The full-jitter wait in seconds after failure ``attempts``."""
    return full_jitter(attempts - 1, policy.base, policy.cap, uniform)


def expiration_ms(seconds: float) -> str:
    """AMQP ``expiration`` property: a string of whole milliseconds (>= 0)."""
    return str(max(0, round(seconds * 1000)))
