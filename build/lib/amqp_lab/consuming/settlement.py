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
transient / unknown       nack(requeue=True)          dead-letter, attempts=2
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

from amqp_lab.errors import BusinessError, PoisonMessage, TransientError
from amqp_lab.retry.policy import REQUEUE_ONCE, RetryPolicy

__all__ = [
    "TRANSIENT_HTTP_STATUSES",
    "Action",
    "Outcome",
    "Settlement",
    "attempt_number",
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
    REQUEUE = "requeue"  # basic.nack(requeue=True)
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


def attempt_number(
    header_attempts: int, redelivered: bool, policy: RetryPolicy = REQUEUE_ONCE
) -> int:
    """The 1-based number of this delivery. Our ``attempts`` header counts the failures already
    settled by republishing. In ``requeue`` mode a broker redelivery (nack requeue, lost
    consumer) adds one; in ``backoff`` mode the redelivered flag is ignored: it is a hint, not a
    counter."""
    if policy.mode == "backoff":
        return header_attempts + 1
    return header_attempts + 1 + (1 if redelivered else 0)


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
