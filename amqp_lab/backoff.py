"""Backoff maths (pure): exponential, capped, full jitter.

``attempt`` n counts from 0; waits are in seconds. Full jitter is ``uniform(0, min(cap,
base * 2**n))`` (AWS Architecture Blog, "Exponential Backoff And Jitter"); tenacity's
``wait_random_exponential`` implements the same strategy for connection and publish retries.
"""

from __future__ import annotations

import random
from collections.abc import Callable


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
