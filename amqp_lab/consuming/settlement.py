"""The consumer's decision (pure): what the handler did + delivery facts -> one settlement.

No I/O here, so every row of the behaviour table is a unit test. The consumer carries the
settlement out in a fixed order: write what must be written (dedup record, DLQ record), wait
for the commit or confirm, then basic.ack / basic.nack / basic.reject.

Behaviour (``requeue`` retry mode, the default):

========================  ==========================  ============================
handler result            first delivery              redelivered (attempt 2)
========================  ==========================  ============================
success                   ack (processed)             ack (processed)
business error            dead-letter, attempts=1     dead-letter, attempts=2
transient / unknown       reject(requeue=True)        dead-letter, attempts=2
poison                    (never first)               dead-letter, handler not run
========================  ==========================  ============================

*Poison*: the broker redelivered the message more often than ``max_redeliveries`` without its
ever being settled - a count the dedup store commits before each handler run, so a handler
that kills the process cannot lose it. It is dead-lettered without running the handler again.

The redelivered flag is a hint, not a counter (amqplib #293): it only allows the one
redelivery. Bounded retries beyond that (``backoff`` mode) count in our own ``attempts`` header:
after failure n < max_attempts the message is republished, with attempts = n, into wait queue n
and comes back when its per-message TTL expires; failure max_attempts dead-letters it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from amqp_lab.errors import BusinessError, PoisonMessage, TransientError
from amqp_lab.retry.policy import REQUEUE_ONCE, RetryPolicy

__all__ = [
    "TRANSIENT_HTTP_STATUSES",
    "Action",
    "Outcome",
    "Settlement",
    "attempt_number",
    "broker_returns",
    "classify",
    "decide",
]

TRANSIENT_HTTP_STATUSES = frozenset({408, 429, 502, 503, 504})


class Outcome(StrEnum):
    """What the handler did."""

    SUCCESS = "success"
    BUSINESS = "business"
    TRANSIENT = "transient"
    UNKNOWN = "unknown"
    POISON = "poison"  # redelivered too often without settlement: the handler is not run


class Action(StrEnum):
    """How the delivery is settled on the channel."""

    ACK = "ack"
    REQUEUE = "requeue"  # basic.reject(requeue=True): counted by a quorum queue on every version
    RETRY_LATER = "retry-later"  # copy to a wait queue (confirmed), then ack
    DEAD_LETTER = "dead-letter"  # DLQ record (confirmed) then ack, or basic.reject(requeue=False)


@dataclass(frozen=True)
class Settlement:
    action: Action
    attempts: int  # how many deliveries of this message have been tried, this one included
    classification: Outcome


def classify(error: BaseException | None) -> Outcome:
    """Classify a handler exception. None -> SUCCESS; PoisonMessage -> POISON;
    BusinessError -> BUSINESS;
    TransientError, timeouts, connection errors and HTTP 408/429/502/503/504 (an exception with a
    ``status_code`` or ``response.status_code``) -> TRANSIENT; anything else -> UNKNOWN."""
    if error is None:
        return Outcome.SUCCESS
    if isinstance(error, PoisonMessage):
        return Outcome.POISON
    if isinstance(error, BusinessError):
        return Outcome.BUSINESS
    if isinstance(error, TransientError | TimeoutError | ConnectionError | socket.timeout):
        return Outcome.TRANSIENT
    status = getattr(error, "status_code", None)
    if status is None:
        status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(status, int) and status in TRANSIENT_HTTP_STATUSES:
        return Outcome.TRANSIENT
    return Outcome.UNKNOWN


def broker_returns(headers: dict[Any, Any], redelivered: bool) -> int:
    """How often the broker has had this message back since it was published (pure): a quorum
    queue's ``x-delivery-count`` header on a redelivered delivery, else 1 for a redelivered
    delivery (the flag is a hint, not a counter: amqplib #293) and 0 for a first one.

    What a quorum queue counts depends on the version
    (https://www.rabbitmq.com/docs/quorum-queues#poison-message-handling): up to 4.2 every
    return (basic.nack, basic.reject, a lost consumer); from 4.3 only basic.reject and a lost
    consumer, not basic.nack (``x-acquired-count`` counts them all). The consumer requeues a
    failure with basic.reject, so a failure is counted under both rules and the count means
    the same on every version; what is merely handed back unstarted (a drain) goes back with
    basic.nack, which 4.3 does not count. A header on a first delivery is the publisher's,
    not the broker's, and is ignored; a value that is not a non-negative integer counts as 1."""
    if not redelivered:
        return 0
    count = headers.get("x-delivery-count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return 1
    return count


def attempt_number(
    header_attempts: int, redelivered: bool, policy: RetryPolicy = REQUEUE_ONCE, returns: int = 0
) -> int:
    """The 1-based number of this delivery. Our ``attempts`` header counts the failures already
    settled by republishing. In ``requeue`` mode each broker return (:func:`broker_returns`:
    a requeue, a lost consumer; at least one when ``redelivered``) adds one; in ``backoff`` mode
    broker returns are ignored: failures are counted by republishing, and a lost consumer's
    redeliveries by the dedup store's poison count."""
    if policy.mode == "backoff":
        return header_attempts + 1
    if redelivered:
        returns = max(returns, 1)
    return header_attempts + 1 + returns


def decide(
    outcome: Outcome, attempt: int, redelivered: bool, policy: RetryPolicy = REQUEUE_ONCE
) -> Settlement:
    """The settlement for one delivery.

    Success: ack. Business error or poison: dead-letter at once. Transient or unknown failure: in
    ``requeue`` mode one broker redelivery (nack requeue), dead-lettered when it fails again; in
    ``backoff`` mode a broker-held delayed retry (wait queue) until ``attempt`` reaches
    ``policy.max_attempts``, then dead-letter."""
    if outcome is Outcome.SUCCESS:
        return Settlement(Action.ACK, attempt, outcome)
    if outcome in (Outcome.BUSINESS, Outcome.POISON):
        return Settlement(Action.DEAD_LETTER, attempt, outcome)
    if policy.mode == "backoff":
        if attempt < policy.max_attempts:
            return Settlement(Action.RETRY_LATER, attempt, outcome)
        return Settlement(Action.DEAD_LETTER, attempt, outcome)
    if not redelivered:
        return Settlement(Action.REQUEUE, attempt, outcome)
    return Settlement(Action.DEAD_LETTER, attempt, outcome)
