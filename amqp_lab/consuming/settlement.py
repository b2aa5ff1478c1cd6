"""The consumer's decision (pure): what the handler did + delivery facts -> one settlement.

No I/O here, so every row of the behaviour table is a unit test. The consumer carries the
settlement out in a fixed order: write what must be written (dedup record, DLQ record), wait
for the commit or confirm, then basic.ack / basic.nack / basic.reject.

Behaviour (``requeue`` retry mode, the default: ``max_attempts`` 2):

========================  ==========================  ============================
handler result            attempt 1                   attempt 2 (= max_attempts)
========================  ==========================  ============================
success                   ack (processed)             ack (processed)
business error            dead-letter, attempts=1     dead-letter, attempts=2
transient / unknown       reject(requeue=True)        dead-letter, attempts=2
poison                    (never first)               dead-letter, handler not run
========================  ==========================  ============================

**Only failures count** (:func:`attempt_number`). A delivery's number is our ``attempts``
header (failures settled by republishing: backoff mode) plus the failures the dedup store
recorded before requeueing it (requeue mode), plus one. Neither the redelivered flag nor a
quorum queue's ``x-delivery-count`` is used: both also count what merely went back unstarted
- a drain's or a stop's hand-back, a lost connection's prefetched deliveries, pika's reject of
what arrives after basic.cancel - and the flag is a hint, not a counter (amqplib #293).
What a quorum queue counts differs by version, too (up to 4.2 every return, from 4.3 not
basic.nack: https://www.rabbitmq.com/docs/quorum-queues#poison-message-handling).

*Poison*: the broker redelivered the message more often than ``max_redeliveries`` while its
handler was running - a count the dedup store commits before each run of a redelivered
delivery, so a handler that kills the process cannot lose it. It is dead-lettered without
running the handler again.

Bounded retries beyond one (``backoff`` mode) count in our own ``attempts`` header: after
failure n < max_attempts the message is republished, with attempts = n, into wait queue n
and comes back when its per-message TTL expires; failure max_attempts dead-letters it.
"""

from __future__ import annotations

import functools
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
    REQUEUE = "requeue"  # basic.reject(requeue=True): counted by a quorum queue on every version
    RETRY_LATER = "retry-later"  # copy to a wait queue (confirmed), then ack
    HOLD = "hold"  # keep it unacked in the worker and run it again after a wait (ordered)
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
    if _http_status(error) in TRANSIENT_HTTP_STATUSES:
        return Outcome.TRANSIENT
    return Outcome.UNKNOWN


def _http_status(error: BaseException) -> int | None:
    """``error.status_code`` or ``error.response.status_code`` when it is an int; None
    otherwise - also when reading them raises (a handler's exception is hostile input)."""
    try:
        status = getattr(error, "status_code", None)
        if status is None:
            status = getattr(getattr(error, "response", None), "status_code", None)
    except Exception:
        return None
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def attempt_number(header_attempts: int, failures: int = 0) -> int:
    """The 1-based number of this delivery: the failures already settled by republishing
    (our ``attempts`` header), plus those the dedup store recorded before requeueing it
    (``failures``, requeue mode; 0 for a delivery that was never redelivered), plus one."""
    return max(0, header_attempts) + max(0, failures) + 1


def decide(outcome: Outcome, attempt: int, policy: RetryPolicy = REQUEUE_ONCE) -> Settlement:
    """The settlement for one delivery, ``attempt`` from :func:`attempt_number`.

    Success: ack. Business error or poison: dead-letter at once. Transient or unknown failure:
    retried until ``attempt`` reaches ``policy.max_attempts`` (2 in requeue mode: one
    immediate broker redelivery), then dead-lettered. ``requeue`` mode retries with
    basic.reject(requeue=True), ``backoff`` mode with a broker-held delayed retry (a wait
    queue), ``hold`` mode (the ordered consumer) in the worker: the delivery stays unacked at
    the head of its key's line and runs again after a full-jitter wait."""
    if outcome is Outcome.SUCCESS:
        return _ack(attempt)  # the same value every time: shared, not built per delivery
    if outcome in (Outcome.BUSINESS, Outcome.POISON) or attempt >= policy.max_attempts:
        return Settlement(Action.DEAD_LETTER, attempt, outcome)
    if policy.mode == "backoff":
        return Settlement(Action.RETRY_LATER, attempt, outcome)
    if policy.mode == "hold":
        return Settlement(Action.HOLD, attempt, outcome)
    return Settlement(Action.REQUEUE, attempt, outcome)


@functools.lru_cache(maxsize=64)
def _ack(attempt: int) -> Settlement:
    """The (immutable) ACK settlement of a successful ``attempt``."""
    return Settlement(Action.ACK, attempt, Outcome.SUCCESS)
