"""The consumer's lifecycle (pure): how each end is classified, the reconnect budget, and the
signal drain's exit codes."""

from __future__ import annotations

import signal

import pytest

from amqp_lab.consuming.lifecycle import End, ReconnectBudget, SignalDrain, classify_end
from amqp_lab.errors import (
    AccessRefused,
    AuthenticationFailed,
    BrokerBlocked,
    BrokerUnavailable,
    ChannelError,
    ConfigurationError,
    ConnectionLost,
    ConsumerCancelled,
    DeadLetterFailed,
    DedupStoreError,
    NotFound,
    PreconditionFailed,
    QueueNotFound,
    RetryTopologyError,
    VhostAccessDenied,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "error",
    [
        ConnectionLost("socket closed"),
        BrokerUnavailable("refused"),
        BrokerBlocked("memory alarm"),
        ConsumerCancelled("queue deleted"),
        PreconditionFailed("406 consumer timeout", 406),
        ChannelError("405 RESOURCE_LOCKED", 405),
    ],
    ids=type,
)
def test_recoverable_ends(error: BaseException) -> None:
    assert classify_end(error) is End.RECOVERABLE


@pytest.mark.parametrize(
    "error",
    [
        QueueNotFound("no queue", "q:tasks", "v"),
        NotFound("404 no exchange", 404),
        AccessRefused("403", 403),
        VhostAccessDenied("vhost gone"),
        AuthenticationFailed("user deleted"),
        RetryTopologyError("wait queue without DLX"),
        DedupStoreError("store down past its bound"),
        DeadLetterFailed("DLQ takes nothing"),
        ConfigurationError("bad option"),
        RuntimeError("a bug"),
        KeyError("a bug"),
    ],
    ids=type,
)
def test_fatal_ends(error: BaseException) -> None:
    assert classify_end(error) is End.FATAL


def test_only_returning_on_its_own_is_finished() -> None:
    assert classify_end(None) is End.FINISHED


def test_a_connection_that_settles_nothing_counts_as_a_failure() -> None:
    budget = ReconnectBudget(3)
    for _ in range(2):
        budget.connection_ended(settled_any=False)
    assert (budget.failures, budget.exhausted) == (2, False)
    budget.connection_ended(settled_any=False)
    assert budget.exhausted  # connect-then-die three times: give up


def test_a_connection_that_settled_something_resets_the_budget() -> None:
    budget = ReconnectBudget(3)
    budget.connection_ended(settled_any=False)
    budget.connection_ended(settled_any=False)
    budget.connection_ended(settled_any=True)
    assert (budget.failures, budget.exhausted) == (0, False)


class _Consumer:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def stop(self, reason: str = "") -> None:
        self.reasons.append(reason)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_first_signal_drains_with_its_exit_code(sig: signal.Signals, code: int) -> None:
    consumer, exits = _Consumer(), list[int]()
    drain = SignalDrain(consumer, exit_now=exits.append)
    before = drain.exit_code
    assert before is None
    drain._handle(sig, None)
    assert (consumer.reasons, drain.exit_code, exits) == ([f"{sig.name} received"], code, [])


def test_second_signal_exits_at_once() -> None:
    consumer, exits = _Consumer(), list[int]()
    drain = SignalDrain(consumer, exit_now=exits.append)
    drain._handle(signal.SIGTERM, None)
    drain._handle(signal.SIGINT, None)
    assert exits == [128 + signal.SIGINT]
    assert consumer.reasons == ["SIGTERM received"]  # asked to drain once only


def test_handlers_are_installed_and_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    drain = SignalDrain(_Consumer(), exit_now=lambda code: None)
    with drain:
        assert signal.getsignal(signal.SIGTERM) == drain._handle
    assert signal.getsignal(signal.SIGTERM) == before
