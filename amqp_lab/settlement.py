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
========================  ==========================  ============================

The redelivered flag is a hint, not a counter (amqplib #293): it only allows the one
redelivery. Bounded retries beyond that need our own ``attempts`` header.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from enum import StrEnum

from amqp_lab.errors import BusinessError, TransientError

TRANSIENT_HTTP_STATUSES = frozenset({408, 429, 502, 503, 504})


class Outcome(StrEnum):
    """What the handler did."""

    SUCCESS = "success"
    BUSINESS = "business"
    TRANSIENT = "transient"
    UNKNOWN = "unknown"


class Action(StrEnum):
    """How the delivery is settled on the channel."""

    ACK = "ack"
    REQUEUE = "requeue"  # basic.nack(requeue=True)
    DEAD_LETTER = "dead-letter"  # DLQ record (confirmed) then ack, or basic.reject(requeue=False)


@dataclass(frozen=True)
class Settlement:
    action: Action
    attempts: int  # how many deliveries of this message have been tried, this one included
    classification: Outcome


def classify(error: BaseException | None) -> Outcome:
    """Classify a handler exception. None -> SUCCESS; BusinessError -> BUSINESS;
    TransientError, timeouts, connection errors and HTTP 408/429/502/503/504 (an exception with a
    ``status_code`` or ``response.status_code``) -> TRANSIENT; anything else -> UNKNOWN."""
    if error is None:
        return Outcome.SUCCESS
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


def attempt_number(header_attempts: int, redelivered: bool) -> int:
    """The 1-based number of this delivery: our ``attempts`` header counts failures already
    settled by republishing; a broker redelivery (nack requeue, lost consumer) adds one."""
    return header_attempts + 1 + (1 if redelivered else 0)


def decide(outcome: Outcome, attempt: int, redelivered: bool) -> Settlement:
    """Settlement for ``requeue`` mode: a transient or unknown failure gets one broker
    redelivery (nack requeue) and is dead-lettered when it fails again; a business error is
    dead-lettered at once."""
    if outcome is Outcome.SUCCESS:
        return Settlement(Action.ACK, attempt, outcome)
    if outcome is Outcome.BUSINESS:
        return Settlement(Action.DEAD_LETTER, attempt, outcome)
    if not redelivered:
        return Settlement(Action.REQUEUE, attempt, outcome)
    return Settlement(Action.DEAD_LETTER, attempt, outcome)
