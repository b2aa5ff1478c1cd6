"""Retention (pure): the retry horizon, the window check, the cutoff, the periodic purge."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_lab.dedup import Purged, StoreStats
from amqp_lab.dedup.retention import (
    DAY,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_RETENTION,
    PeriodicPurge,
    check_retention,
    cutoff,
    minimum_retention,
    purge_expired,
    retry_horizon,
)
from amqp_lab.errors import ConfigurationError, DedupStoreError
from amqp_lab.retry.policy import RetryPolicy

pytestmark = pytest.mark.unit

LONGEST = RetryPolicy("backoff", max_attempts=10, base=300, cap=300)  # 9 wait queues x 300 s


# --- the horizon -------------------------------------------------------------------------------
def test_requeue_mode_has_no_horizon() -> None:
    assert retry_horizon(RetryPolicy()) == 0.0


def test_backoff_horizon_sums_the_capped_waits_of_attempts_1_to_n_minus_1() -> None:
    assert retry_horizon(RetryPolicy("backoff", max_attempts=5, base=1, cap=30)) == 15.0  # 1+2+4+8
    assert retry_horizon(RetryPolicy("backoff", max_attempts=10, base=1, cap=30)) == 151.0
    assert retry_horizon(RetryPolicy("backoff", max_attempts=3, base=0.5, cap=30)) == 1.5


def test_a_single_attempt_never_waits() -> None:
    assert retry_horizon(RetryPolicy("backoff", max_attempts=1, base=1, cap=30)) == 0.0


def test_the_longest_policy_the_topology_allows_is_45_minutes() -> None:
    assert retry_horizon(LONGEST) == 2700.0


@given(
    attempts=st.integers(1, 10),
    base=st.integers(0, 600).map(lambda ms: ms / 8),  # exact binary fractions: no rounding
    cap=st.integers(0, 2400).map(lambda ms: ms / 8),
)
def test_horizon_is_bounded_by_cap_per_retry_and_grows_with_attempts(
    attempts: int, base: float, cap: float
) -> None:
    policy = RetryPolicy("backoff", attempts, base, cap)
    assert 0 <= retry_horizon(policy) <= (attempts - 1) * cap
    longer = RetryPolicy("backoff", attempts + 1, base, cap)
    assert retry_horizon(longer) >= retry_horizon(policy)


# --- the check ----------------------------------------------------------------------------------
def test_defaults_pass_even_with_the_longest_policy() -> None:
    assert DEFAULT_RETENTION == 7 * DAY
    assert minimum_retention(LONGEST, DEFAULT_REPLAY_WINDOW) == 3 * DAY + 2700
    check_retention(DEFAULT_RETENTION, LONGEST, DEFAULT_REPLAY_WINDOW)


def test_a_window_just_longer_than_horizon_plus_replay_passes() -> None:
    check_retention(3 * DAY + 2700.001, LONGEST, 3 * DAY)


def test_a_window_equal_to_horizon_plus_replay_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"is not longer than the retry horizon"):
        check_retention(3 * DAY + 2700, LONGEST, 3 * DAY)


def test_the_refusal_names_every_number() -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_retention(DAY, RetryPolicy("backoff", 5, 1, 30), DAY)
    assert str(caught.value) == (
        "dedup retention of 86400 s (1 days) is not longer than the retry horizon 15 s "
        "(0.0001736 days) plus the replay window 86400 s (1 days): a copy arriving later would "
        "be applied twice; keep records longer than 86415 s (1 days)"
    )


def test_a_negative_replay_window_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"^the replay window must be >= 0, got -1 s$"):
        check_retention(DAY, RetryPolicy(), -1)


def test_cutoff_is_now_minus_the_window() -> None:
    assert cutoff(10_000.0, 2_500.0) == 7_500.0


# --- purging -----------------------------------------------------------------------------------
class FakeStore:
    """Records purge cutoffs; fails the first ``failures`` purges."""

    placeholder = "?"
    location = "fake"

    def __init__(self, failures: int = 0) -> None:
        self.cutoffs: list[float] = []
        self.failures = failures

    def purge(self, older_than: float) -> Purged:
        if self.failures:
            self.failures -= 1
            raise DedupStoreError("database is locked")
        self.cutoffs.append(older_than)
        return Purged(len(self.cutoffs), 0)

    def stats(self) -> StoreStats:
        return StoreStats(0, None)


def test_purge_expired_deletes_before_now_minus_retention() -> None:
    store = FakeStore()
    assert purge_expired(store, 7 * DAY, clock=lambda: 10 * DAY) == Purged(1, 0)  # type: ignore[arg-type]
    assert store.cutoffs == [3 * DAY]


def test_periodic_purge_runs_at_start_and_every_interval() -> None:
    store = FakeStore()
    done = threading.Event()
    results: list[Purged] = []

    def seen(p: Purged) -> None:
        results.append(p)
        if len(results) == 3:
            done.set()

    purger = PeriodicPurge(store, 100.0, 0.01, seen, clock=lambda: 1000.0)  # type: ignore[arg-type]
    purger.start()
    assert done.wait(10)
    purger.stop()
    assert store.cutoffs[:3] == [900.0, 900.0, 900.0]
    assert [p.processed for p in results[:3]] == [1, 2, 3]


def test_a_failed_purge_is_retried_at_the_next_interval() -> None:
    store = FakeStore(failures=2)
    done = threading.Event()
    purger = PeriodicPurge(store, 100.0, 0.01, lambda p: done.set(), clock=lambda: 1000.0)  # type: ignore[arg-type]
    purger.start()
    assert done.wait(10)
    purger.stop()
    assert (store.failures, store.cutoffs[0]) == (0, 900.0)


def test_the_purge_interval_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match=r"^purge interval must be > 0 seconds, got 0$"):
        PeriodicPurge(FakeStore(), 100.0, 0)  # type: ignore[arg-type]
