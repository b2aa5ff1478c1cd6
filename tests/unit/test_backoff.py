"""Backoff maths: exponential, capped, full jitter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab.retry.policy import capped, exponential, full_jitter

pytestmark = pytest.mark.unit


def test_exponential_doubles_from_base_one() -> None:
    assert [exponential(n, 1) for n in range(6)] == [1, 2, 4, 8, 16, 32]


def test_exponential_scales_with_base() -> None:
    assert [exponential(n, 0.5) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]


def test_exponential_with_zero_base_is_zero() -> None:
    assert exponential(10, 0) == 0


@pytest.mark.parametrize(("attempt", "base"), [(-1, 1.0), (0, -0.5)])
def test_exponential_rejects_negative_input(attempt: int, base: float) -> None:
    with pytest.raises(ValueError, match=r"attempt and base must be >= 0"):
        exponential(attempt, base)


def test_capped_stops_at_the_cap() -> None:
    # 2**5 = 32 is the first wait over 30, so attempts 5..8 all wait the cap.
    assert [capped(n, 1, 30) for n in range(9)] == [1, 2, 4, 8, 16, 30, 30, 30, 30]


def test_capped_without_cap_is_exponential() -> None:
    assert capped(10, 1, None) == 1024


def test_full_jitter_draws_between_zero_and_the_capped_wait() -> None:
    calls: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        calls.append((low, high))
        return high / 4

    assert full_jitter(3, 1.0, 30.0, uniform=uniform) == 2.0
    assert calls == [(0.0, 8.0)]


def test_full_jitter_passes_the_cap_to_uniform() -> None:
    calls: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        calls.append((low, high))
        return high

    assert full_jitter(8, 1.0, 30.0, uniform=uniform) == 30.0
    assert calls == [(0.0, 30.0)]


@settings(database=None)
@given(
    attempt=st.integers(min_value=0, max_value=60),
    base=st.floats(min_value=0, max_value=100, allow_nan=False),
    cap=st.none() | st.floats(min_value=0, max_value=1000, allow_nan=False),
)
def test_full_jitter_with_random_stays_within_the_capped_wait(
    attempt: int, base: float, cap: float | None
) -> None:
    wait = full_jitter(attempt, base, cap)
    assert 0.0 <= wait <= capped(attempt, base, cap)
