"""Backoff (pure): the maths, the one :class:`Backoff` policy type every retry uses - message
retries, publish retries, reconnects, store outages - and the consumer's :class:`RetryPolicy`.

``attempt`` n counts from 0; waits are in seconds. Full jitter is ``uniform(0, min(cap,
base * 2**n))`` (AWS Architecture Blog, "Exponential Backoff And Jitter"); tenacity's
``wait_random_exponential`` implements the same strategy, and :meth:`Backoff.tenacity` gives
it for the retries tenacity runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tenacity import wait_random_exponential
from tenacity.wait import wait_base

from amqp_lab.errors import ConfigurationError

__all__ = [
    "REQUEUE_ONCE",
    "Backoff",
    "RetryPolicy",
    "capped",
    "exponential",
    "full_jitter",
]


def exponential(attempt: int, base: float) -> float:
    """``base * 2**attempt`` seconds. Raises ValueError for a negative attempt or base."""
    if attempt < 0 or base < 0:
        raise ValueError(f"attempt and base must be >= 0, got attempt={attempt} base={base}")
    return base * 2.0**attempt


def capped(attempt: int, base: float, cap: float | None) -> float:
    """``min(cap, base * 2**attempt)`` seconds; no cap when ``cap`` is None."""
    try:
        wait = exponential(attempt, base)
    except OverflowError:
        wait = float("inf")
    return wait if cap is None else min(cap, wait)


def full_jitter(
    attempt: int,
    base: float,
    cap: float | None,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """``uniform(0, min(cap, base * 2**attempt))`` seconds; inject ``uniform`` for exact tests."""
    return uniform(0.0, capped(attempt, base, cap))


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter and a cap: attempt n (from 0) waits
    ``uniform(0, min(cap, base * 2**n))`` seconds. ``cap`` None: no cap."""

    base: float
    cap: float | None

    def __post_init__(self) -> None:
        if self.base < 0 or (self.cap is not None and self.cap < 0):
            raise ValueError(f"invalid backoff {self}")

    def bound(self, attempt: int) -> float:
        """The longest wait of ``attempt``: ``min(cap, base * 2**attempt)`` seconds."""
        return capped(attempt, self.base, self.cap)

    def wait(
        self, attempt: int, uniform: Callable[[float, float], float] = random.uniform
    ) -> float:
        """A full-jitter wait for ``attempt``, in seconds."""
        return full_jitter(attempt, self.base, self.cap, uniform)

    def tenacity(self) -> wait_base:
        """The same strategy as a tenacity wait (tenacity counts attempts from 1)."""
        return wait_random_exponential(
            multiplier=self.base, max=float("inf") if self.cap is None else self.cap
        )


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures are retried.

    ``requeue``: one immediate broker redelivery (basic.reject requeue), then the DLQ.
    ``backoff``: up to ``max_attempts`` deliveries in all; after failure n the message waits
    ``uniform(0, min(cap, base * 2**(n-1)))`` seconds in wait queue n, held by the broker.
    ``hold`` (the ordered consumer): the same tries and waits, held unacked in the worker.
    ``base`` and ``cap`` are in seconds. Raises ConfigurationError (one line naming the field)
    for ``max_attempts`` below 1 or a negative ``base`` or ``cap``.
    """

    mode: Literal["requeue", "backoff", "hold"] = "requeue"
    max_attempts: int = 2
    base: float = 1.0
    cap: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be >= 1, not {self.max_attempts}")
        if not (self.base >= 0 and self.cap >= 0):  # NaN too
            raise ConfigurationError(
                f"base and cap must be >= 0 seconds, not base {self.base:g} cap {self.cap:g}"
            )

    @property
    def backoff(self) -> Backoff:
        """The wait queue backoff: ``base`` and ``cap`` seconds."""
        return Backoff(self.base, self.cap)


REQUEUE_ONCE = RetryPolicy()
