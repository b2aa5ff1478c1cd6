"""Settlement: classify the handler's result, count attempts, decide how to settle."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from amqp_lab.consuming.settlement import (
    Action,
    Outcome,
    Settlement,
    attempt_number,
    classify,
    decide,
)
from amqp_lab.errors import BusinessError, InvalidMessage, PoisonMessage, TransientError
from amqp_lab.retry.policy import RetryPolicy

pytestmark = pytest.mark.unit


class StatusError(Exception):
    """An HTTP client error carrying ``status_code`` directly."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class ResponseError(Exception):
    """An HTTP client error carrying ``response.status_code``."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.response = SimpleNamespace(status_code=status_code)


def _httpx_error(status_code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://api.invalid/thing")
    response = httpx.Response(status_code, request=request)
    return httpx.HTTPStatusError(f"HTTP {status_code}", request=request, response=response)


# --- classify ------------------------------------------------------------------------------
def test_no_error_is_success() -> None:
    assert classify(None) is Outcome.SUCCESS


@pytest.mark.parametrize(
    "error",
    [BusinessError("bad order"), InvalidMessage("not JSON")],
    ids=["business-error", "invalid-message"],
)
def test_business_errors_are_business(error: BaseException) -> None:
    assert classify(error) is Outcome.BUSINESS


@pytest.mark.parametrize(
    "error",
    [
        TransientError("try later"),
        TimeoutError("timed out"),
        ConnectionError("reset"),
        ConnectionRefusedError("refused"),
        ConnectionResetError("reset by peer"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient_errors_are_transient(error: BaseException) -> None:
    assert classify(error) is Outcome.TRANSIENT


@pytest.mark.parametrize("status", [408, 429, 502, 503, 504])
def test_transient_http_status_code_is_transient(status: int) -> None:
    assert classify(StatusError(status)) is Outcome.TRANSIENT


@pytest.mark.parametrize("status", [429, 503])
def test_transient_response_status_code_is_transient(status: int) -> None:
    assert classify(ResponseError(status)) is Outcome.TRANSIENT


def test_httpx_503_is_transient() -> None:
    assert classify(_httpx_error(503)) is Outcome.TRANSIENT


@pytest.mark.parametrize("status", [400, 404, 500, 501])
def test_other_http_status_is_unknown(status: int) -> None:
    assert classify(StatusError(status)) is Outcome.UNKNOWN


def test_httpx_500_is_unknown() -> None:
    assert classify(_httpx_error(500)) is Outcome.UNKNOWN


@pytest.mark.parametrize(
    "error",
    [RuntimeError("boom"), ValueError("bad"), KeyError("k"), ResponseError(500)],
    ids=["RuntimeError", "ValueError", "KeyError", "response-500"],
)
def test_other_exceptions_are_unknown(error: BaseException) -> None:
    assert classify(error) is Outcome.UNKNOWN


# --- attempt_number: failures only -------------------------------------------------------------
@pytest.mark.parametrize(
    ("header_attempts", "failures", "attempt"),
    [
        pytest.param(0, 0, 1, id="first-delivery"),
        pytest.param(0, 1, 2, id="requeued-after-one-failure"),
        pytest.param(2, 0, 3, id="republished-after-two-failures"),
        pytest.param(2, 1, 4, id="republished-then-requeued"),
        pytest.param(-3, -1, 1, id="negative-values-count-as-none"),
    ],
)
def test_attempt_number(header_attempts: int, failures: int, attempt: int) -> None:
    assert attempt_number(header_attempts, failures) == attempt


def test_a_hand_back_is_no_failure_so_the_number_stays() -> None:
    """A redelivery without a recorded failure (a drain's hand-back, a lost connection) is the
    same attempt again: the redelivered flag and x-delivery-count are not read at all."""
    assert attempt_number(0) == attempt_number(0, 0) == 1


# --- decide: one test per cell of the module docstring's table --------------------------------
@pytest.mark.parametrize(
    ("outcome", "attempt", "expected"),
    [
        pytest.param(
            Outcome.SUCCESS,
            1,
            Settlement(Action.ACK, 1, Outcome.SUCCESS),
            id="success-attempt-1-ack",
        ),
        pytest.param(
            Outcome.SUCCESS,
            2,
            Settlement(Action.ACK, 2, Outcome.SUCCESS),
            id="success-attempt-2-ack",
        ),
        pytest.param(
            Outcome.BUSINESS,
            1,
            Settlement(Action.DEAD_LETTER, 1, Outcome.BUSINESS),
            id="business-attempt-1-dead-letter-attempts-1",
        ),
        pytest.param(
            Outcome.BUSINESS,
            2,
            Settlement(Action.DEAD_LETTER, 2, Outcome.BUSINESS),
            id="business-attempt-2-dead-letter-attempts-2",
        ),
        pytest.param(
            Outcome.TRANSIENT,
            1,
            Settlement(Action.REQUEUE, 1, Outcome.TRANSIENT),
            id="transient-attempt-1-requeue",
        ),
        pytest.param(
            Outcome.TRANSIENT,
            2,
            Settlement(Action.DEAD_LETTER, 2, Outcome.TRANSIENT),
            id="transient-attempt-2-dead-letter-attempts-2",
        ),
        pytest.param(
            Outcome.UNKNOWN,
            1,
            Settlement(Action.REQUEUE, 1, Outcome.UNKNOWN),
            id="unknown-attempt-1-requeue",
        ),
        pytest.param(
            Outcome.UNKNOWN,
            2,
            Settlement(Action.DEAD_LETTER, 2, Outcome.UNKNOWN),
            id="unknown-attempt-2-dead-letter-attempts-2",
        ),
        pytest.param(
            Outcome.POISON,
            2,
            Settlement(Action.DEAD_LETTER, 2, Outcome.POISON),
            id="poison-attempt-2-dead-letter-without-handler",
        ),
    ],
)
def test_decide_table(outcome: Outcome, attempt: int, expected: Settlement) -> None:
    assert decide(outcome, attempt) == expected


@pytest.mark.parametrize(
    ("error", "header_attempts", "failures", "expected"),
    [
        pytest.param(None, 0, 0, Settlement(Action.ACK, 1, Outcome.SUCCESS), id="fresh-success"),
        pytest.param(
            _httpx_error(503),
            0,
            0,
            Settlement(Action.REQUEUE, 1, Outcome.TRANSIENT),
            id="fresh-503-requeued",
        ),
        pytest.param(
            _httpx_error(503),
            0,
            1,
            Settlement(Action.DEAD_LETTER, 2, Outcome.TRANSIENT),
            id="after-one-failure-503-dead-lettered",
        ),
        pytest.param(
            BusinessError("no such customer"),
            1,
            0,
            Settlement(Action.DEAD_LETTER, 2, Outcome.BUSINESS),
            id="republished-business-error",
        ),
        pytest.param(
            RuntimeError("bug"),
            0,
            1,
            Settlement(Action.DEAD_LETTER, 2, Outcome.UNKNOWN),
            id="after-one-failure-bug-dead-lettered",
        ),
        pytest.param(
            PoisonMessage("delivered 5 times"),
            0,
            1,
            Settlement(Action.DEAD_LETTER, 2, Outcome.POISON),
            id="after-one-failure-poison-dead-lettered",
        ),
    ],
)
def test_classify_then_decide(
    error: BaseException | None, header_attempts: int, failures: int, expected: Settlement
) -> None:
    attempt = attempt_number(header_attempts, failures)
    assert decide(classify(error), attempt) == expected


def test_poison_is_dead_lettered_in_backoff_mode_too() -> None:
    policy = RetryPolicy("backoff", max_attempts=5)
    assert decide(Outcome.POISON, 1, policy) == Settlement(Action.DEAD_LETTER, 1, Outcome.POISON)


@pytest.mark.parametrize(
    ("attempt", "action"),
    [(1, Action.RETRY_LATER), (4, Action.RETRY_LATER), (5, Action.DEAD_LETTER)],
)
def test_backoff_retries_until_max_attempts(attempt: int, action: Action) -> None:
    policy = RetryPolicy("backoff", max_attempts=5)
    assert decide(Outcome.TRANSIENT, attempt, policy).action is action


@pytest.mark.parametrize(
    ("attempt", "action"), [(1, Action.REQUEUE), (2, Action.REQUEUE), (3, Action.DEAD_LETTER)]
)
def test_requeue_mode_honours_max_attempts(attempt: int, action: Action) -> None:
    policy = RetryPolicy("requeue", max_attempts=3)
    assert decide(Outcome.UNKNOWN, attempt, policy).action is action


class HostileError(Exception):
    """An exception whose attributes raise when read."""

    @property
    def status_code(self) -> int:
        raise RuntimeError("boom")

    def __str__(self) -> str:
        raise ValueError("no text")


def test_classify_never_raises_on_a_hostile_exception() -> None:
    assert classify(HostileError()) is Outcome.UNKNOWN


def test_a_bool_status_code_is_not_an_http_status() -> None:
    assert classify(StatusError(True)) is Outcome.UNKNOWN
