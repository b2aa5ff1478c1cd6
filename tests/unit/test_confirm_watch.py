"""When a publisher gives a connection up for a missing publisher confirm
(amqp_lab.publishing.confirm_watch): the clock, progress, blocked connections, no timeout."""

from __future__ import annotations

import pytest

from amqp_lab.publishing.confirm_watch import ConfirmWatch

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_overdue_once_the_oldest_unconfirmed_publish_waited_the_timeout() -> None:
    clock = Clock()
    watch = ConfirmWatch(5.0, clock)
    clock.now = 110.0
    assert watch.overdue(106.0, blocked=False) is False  # 4 s old
    assert watch.overdue(105.0, blocked=False) is True  # 5 s old, no progress since


def test_nothing_unconfirmed_is_never_overdue() -> None:
    clock = Clock()
    watch = ConfirmWatch(5.0, clock)
    clock.now = 1000.0
    assert watch.overdue(None, blocked=False) is False


def test_progress_restarts_the_clock_for_publishes_sent_before_it() -> None:
    clock = Clock()
    watch = ConfirmWatch(5.0, clock)
    clock.now = 108.0
    watch.progress()  # a confirm for another publish arrived at 108
    clock.now = 112.0
    assert watch.overdue(101.0, blocked=False) is False  # 11 s old, but 4 s since progress
    clock.now = 113.0
    assert watch.overdue(101.0, blocked=False) is True


def test_a_blocked_connection_is_never_overdue() -> None:
    clock = Clock()
    watch = ConfirmWatch(5.0, clock)
    clock.now = 200.0
    assert watch.overdue(100.0, blocked=True) is False
    assert watch.overdue(100.0, blocked=False) is True


def test_without_a_timeout_nothing_is_overdue_and_nothing_is_looked_at() -> None:
    clock = Clock()
    watch = ConfirmWatch(None, clock)
    clock.now = 10_000.0
    assert (watch.overdue(0.0, blocked=False), watch.interval) == (False, None)


@pytest.mark.parametrize(("timeout", "interval"), [(30.0, 1.0), (2.0, 0.5), (0.2, 0.05)])
def test_looks_come_four_times_per_timeout_at_most_every_second(
    timeout: float, interval: float
) -> None:
    assert ConfirmWatch(timeout).interval == interval


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_a_timeout_that_is_not_positive_is_refused(timeout: float) -> None:
    with pytest.raises(ValueError, match="confirm_timeout must be > 0 seconds or None"):
        ConfirmWatch(timeout)
