"""confirm_deadline against a fake pika connection whose timers the test fires by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika.exceptions as pe
import pytest

from amqp_lab.consuming.config import ConsumerConfig
from amqp_lab.errors import ConfigurationError
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.publishing.confirm_deadline import DEFAULT_CONFIRM_TIMEOUT, confirm_deadline
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology.model import Names

pytestmark = pytest.mark.unit


class FakeImpl:
    """The three pika internals confirm_deadline uses, with timers kept for the test."""

    def __init__(self) -> None:
        self.is_open = True
        self.timers: dict[int, tuple[float, Callable[[], None]]] = {}
        self.removed: list[int] = []
        self.terminated: list[BaseException] = []
        self._next = 0

    def _adapter_call_later(self, delay: float, callback: Callable[[], None]) -> int:
        self._next += 1
        self.timers[self._next] = (delay, callback)
        return self._next

    def _adapter_remove_timeout(self, timer: int) -> None:
        self.removed.append(timer)
        self.timers.pop(timer, None)

    def _terminate_stream(self, error: BaseException) -> None:
        self.terminated.append(error)

    def fire(self) -> None:
        """Run the one pending timer, as pika's ioloop does inside basic_publish's wait."""
        ((timer, (_, callback)),) = self.timers.items()
        del self.timers[timer]
        callback()


class FakeConnection:
    def __init__(self) -> None:
        self._impl = FakeImpl()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_overdue_confirm_ends_the_stream_with_the_reason() -> None:
    connection, clock = FakeConnection(), Clock()
    impl = connection._impl
    with confirm_deadline(connection, 2.0, clock=clock):
        assert [delay for delay, _ in impl.timers.values()] == [0.5]  # a quarter of 2 s
        clock.now += 1.0
        impl.fire()  # not overdue yet: looks again
        assert impl.terminated == [] and len(impl.timers) == 1
        clock.now += 1.0
        impl.fire()
        assert impl.timers == {}
    (error,) = impl.terminated
    assert isinstance(error, pe.StreamLostError)
    assert str(error) == "no publisher confirm within 2.0 s"
    assert impl.removed == []  # nothing left to remove


def test_a_look_after_the_stream_ended_otherwise_does_nothing() -> None:
    """EOF or connection.close in the same pass of the I/O loop as an overdue look: pika has
    torn the stream down already (terminating it again would raise AttributeError)."""
    connection, clock = FakeConnection(), Clock()
    impl = connection._impl
    with confirm_deadline(connection, 2.0, clock=clock):
        clock.now += 5.0
        impl.is_open = False
        impl.fire()
        assert impl.timers == {}
    assert impl.terminated == []


def test_a_confirm_in_time_removes_the_timer() -> None:
    connection = FakeConnection()
    impl = connection._impl
    with confirm_deadline(connection, 30.0):
        (timer,) = impl.timers
    assert impl.removed == [timer] and impl.timers == {} and impl.terminated == []


def test_a_timer_is_removed_when_the_publish_raises() -> None:
    connection = FakeConnection()
    impl = connection._impl
    with pytest.raises(pe.ChannelClosedByBroker), confirm_deadline(connection, 30.0):
        raise pe.ChannelClosedByBroker(404, "NOT_FOUND")
    assert impl.timers == {} and len(impl.removed) == 1


def test_time_blocked_by_the_broker_does_not_count() -> None:
    connection, clock = FakeConnection(), Clock()
    impl = connection._impl
    blocked = [True]
    with confirm_deadline(connection, 2.0, lambda: blocked[0], clock=clock):
        clock.now += 10.0  # blocked far past the timeout: blocked_connection_timeout's case
        impl.fire()
        assert impl.terminated == []
        blocked[0] = False
        clock.now += 1.5  # unblocked since the last look, under the timeout
        impl.fire()
        assert impl.terminated == []
        clock.now += 0.5
        impl.fire()
    assert len(impl.terminated) == 1


def test_no_timeout_or_no_pika_internals_means_no_limit() -> None:
    connection = FakeConnection()
    with confirm_deadline(connection, None):
        assert connection._impl.timers == {}
    with confirm_deadline(object(), 1.0):  # another pika: no _impl internals, no limit
        pass


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_a_timeout_that_is_not_positive_is_refused(timeout: float) -> None:
    with pytest.raises(ValueError, match="confirm_timeout must be > 0"):
        Publisher(BrokerSettings("amqp://guest:guest@127.0.0.1/%2F"), confirm_timeout=timeout)
    names = Names("tasks", "task", "q:tasks", "tasks.dlx", "q:tasks:dlq")
    with pytest.raises(ConfigurationError, match="confirm_timeout must be > 0"):
        ConsumerConfig(names, confirm_timeout=timeout).check_bounds()


def test_the_consumer_gives_its_confirm_timeout_to_the_engine() -> None:
    names = Names("tasks", "task", "q:tasks", "tasks.dlx", "q:tasks:dlq")
    expectations: Any = None
    assert ConsumerConfig(names).engine_config("dlx", expectations).confirm_timeout == (
        DEFAULT_CONFIRM_TIMEOUT
    )
    config = ConsumerConfig(names, confirm_timeout=None)
    assert config.engine_config("dlx", expectations).confirm_timeout is None
