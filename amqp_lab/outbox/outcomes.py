"""What becomes of a leased row after its publish (pure: no I/O).

Every publish ends in one outcome (:mod:`amqp_lab.publishing.confirm`), and every leased row
in one :class:`Verdict`:

* ``sent`` - the broker confirmed it: the row is deleted, or kept with ``sent_at`` for the
  retention period;
* ``refused`` - the broker refused *this* message (basic.return: unroutable; basic.nack after
  the publisher's retries; the channel closed because of it: 404 no exchange, 403, 406 too
  large) or it cannot be sent at all (a property or header AMQP cannot carry, a row that is no
  message). The row stays with its error and blocks its key's later rows, nothing else; it is
  tried again after a capped backoff - a binding added, the queue drained, ``max_message_size``
  raised - or, when no retry can help (unencodable, undecodable), *parked* until an operator
  retries or discards it (``amqp-lab-relay retry|discard``);
* ``lost`` - no answer about it: the connection or channel failed, the broker blocked the
  connection past its timeout, the relay stopped before the confirm. The message may be in its
  queue: the row's lease is released and it is published again (same message_id: the
  consumer's dedup absorbs a copy) - the row is not marked refused, it did nothing wrong;
* ``unattempted`` - never handed to the publisher (behind a failure in its chain): released.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from enum import StrEnum
from typing import NamedTuple

from amqp_lab.errors import (
    AmqpLabError,
    ChannelError,
    MessageNacked,
    MessageUnroutable,
    UnencodableMessage,
    error_text,
)
from amqp_lab.outbox.row import RowUndecodable
from amqp_lab.retry.policy import capped

__all__ = [
    "LOST_DELAY",
    "PARKED",
    "RowResult",
    "Verdict",
    "describe",
    "judge",
    "refusal_delay",
    "result_for",
]

PARKED = float("inf")
"""``available_at`` of a parked row: no relay takes it until an operator retries it."""
LOST_DELAY = 1.0
"""Seconds a lost row waits before it is leased again (the broker's trouble may last)."""


class Verdict(StrEnum):
    """A leased row's fate (see the module doc)."""

    SENT = "sent"
    REFUSED = "refused"
    LOST = "lost"
    UNATTEMPTED = "unattempted"


class RowResult(NamedTuple):
    """One row's outcome: ``verdict``; for ``refused`` and ``lost`` the ``error`` (one line)
    and ``wait``, seconds before it may be leased again (``inf``: parked). A named tuple: a
    relay makes one per row it publishes."""

    row_id: int
    verdict: Verdict
    error: str | None = None
    wait: float = 0.0

    @property
    def parked(self) -> bool:
        return self.wait == PARKED


def judge(error: BaseException | None) -> tuple[Verdict, bool]:
    """The verdict for a publish outcome (``error`` None: confirmed) and whether a refusal is
    for good (parked): a message that cannot be encoded or a row that cannot be read will not
    change by waiting. Every other error, one this module does not know included, is ``lost``:
    retrying it can only duplicate, never lose."""
    if error is None:
        return Verdict.SENT, False
    if isinstance(error, UnencodableMessage | RowUndecodable):
        return Verdict.REFUSED, True
    if isinstance(error, MessageUnroutable | MessageNacked | ChannelError):
        return Verdict.REFUSED, False
    return Verdict.LOST, False


def refusal_delay(
    refusals: int,
    base: float,
    cap: float,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds before a row refused ``refusals`` times in a row (>= 1) is tried again:
    ``min(cap, base * 2**(refusals-1))``, jittered down by at most half so that rows refused
    together spread out."""
    bound = capped(max(0, refusals - 1), base, cap)
    return uniform(bound / 2, bound)


def result_for(
    row_id: int,
    error: BaseException | None,
    refusals: int,
    base: float,
    cap: float,
    uniform: Callable[[float, float], float] = random.uniform,
) -> RowResult:
    """:class:`RowResult` of a settled publish: :func:`judge`'s verdict, the error as one
    line (with its type), the wait (:func:`refusal_delay`, PARKED or LOST_DELAY)."""
    verdict, parked = judge(error)
    if error is None:
        return RowResult(row_id, verdict)
    text = f"{type(error).__name__}: {error_text(error, 2000)}"
    if verdict is Verdict.LOST:
        return RowResult(row_id, verdict, text, LOST_DELAY)
    wait = PARKED if parked else refusal_delay(refusals, base, cap, uniform)
    return RowResult(row_id, verdict, text, wait)


def describe(error: AmqpLabError | BaseException) -> str:
    """``Type: text`` on one line, for logs."""
    return f"{type(error).__name__}: {error_text(error, 300)}"
