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
    broker_returns,
    classify,
    decide,
)
from amqp_lab.errors import BusinessError, InvalidMessage, PoisonMessage, TransientError
from amqp_lab.retry.policy import REQUEUE_ONCE, RetryPolicy

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


# --- attempt_number ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header_attempts", "redelivered", "attempt"),
    [(0, False, 1), (0, True, 2), (2, False, 3), (2, True, 4)],
)
def test_attempt_number(header_attempts: int, redelivered: bool, attempt: int) -> None:
    assert attempt_number(header_attempts, redelivered) == attempt


# --- decide: one test per cell of the module docstring's table --------------------------------
@pytest.mark.parametrize(
    ("outcome", "attempt", "redelivered", "expected"),
    [
        pytest.param(
            Outcome.SUCCESS,
            1,
            False,
            Settlement(Action.ACK, 1, Outcome.SUCCESS),
            id="success-first-delivery-ack",
        ),
        pytest.param(
            Outcome.SUCCESS,
            2,
            True,
            Settlement(Action.ACK, 2, Outcome.SUCCESS),
            id="success-redelivered-ack",
        ),
        pytest.param(
            Outcome.BUSINESS,
            1,
            False,
            Settlement(Action.DEAD_LETTER, 1, Outcome.BUSINESS),
            id="business-first-delivery-dead-letter-attempts-1",
        ),
        pytest.param(
            Outcome.BUSINESS,
            2,
            True,
            Settlement(Action.DEAD_LETTER, 2, Outcome.BUSINESS),
            id="business-redelivered-dead-letter-attempts-2",
        ),
        pytest.param(
            Outcome.TRANSIENT,
            1,
            False,
            Settlement(Action.REQUEUE, 1, Outcome.TRANSIENT),
            id="transient-first-delivery-requeue",
        ),
        pytest.param(
            Outcome.TRANSIENT,
            2,
            True,
            Settlement(Action.DEAD_LETTER, 2, Outcome.TRANSIENT),
            id="transient-redelivered-dead-letter-attempts-2",
        ),
        pytest.param(
            Outcome.UNKNOWN,
            1,
            False,
            Settlement(Action.REQUEUE, 1, Outcome.UNKNOWN),
            id="unknown-first-delivery-requeue",
        ),
        pytest.param(
            Outcome.UNKNOWN,
            2,
            True,
            Settlement(Action.DEAD_LETTER, 2, Outcome.UNKNOWN),
            id="unknown-redelivered-dead-letter-attempts-2",
        ),
        pytest.param(
            Outcome.POISON,
            2,
            True,
            Settlement(Action.DEAD_LETTER, 2, Outcome.POISON),
            id="poison-redelivered-dead-letter-without-handler",
        ),
    ],
)
def test_decide_table(
    outcome: Outcome, attempt: int, redelivered: bool, expected: Settlement
) -> None:
    assert decide(outcome, attempt, redelivered) == expected


@pytest.mark.parametrize(
    ("error", "header_attempts", "redelivered", "expected"),
    [
        pytest.param(
            None, 0, False, Settlement(Action.ACK, 1, Outcome.SUCCESS), id="fresh-success"
        ),
        pytest.param(
            _httpx_error(503),
            0,
            False,
            Settlement(Action.REQUEUE, 1, Outcome.TRANSIENT),
            id="fresh-503-requeued",
        ),
        pytest.param(
            _httpx_error(503),
            0,
            True,
            Settlement(Action.DEAD_LETTER, 2, Outcome.TRANSIENT),
            id="redelivered-503-dead-lettered",
        ),
        pytest.param(
            BusinessError("no such customer"),
            1,
            False,
            Settlement(Action.DEAD_LETTER, 2, Outcome.BUSINESS),
            id="republished-business-error",
        ),
        pytest.param(
            RuntimeError("bug"),
            0,
            True,
            Settlement(Action.DEAD_LETTER, 2, Outcome.UNKNOWN),
            id="redelivered-bug-dead-lettered",
        ),
        pytest.param(
            PoisonMessage("delivered 5 times"),
            0,
            True,
            Settlement(Action.DEAD_LETTER, 2, Outcome.POISON),
            id="redelivered-poison-dead-lettered",
        ),
    ],
)
def test_classify_then_decide(
    error: BaseException | None, header_attempts: int, redelivered: bool, expected: Settlement
) -> None:
    attempt = attempt_number(header_attempts, redelivered)
    assert decide(classify(error), attempt, redelivered) == expected


def test_poison_is_dead_lettered_in_backoff_mode_too() -> None:
    policy = RetryPolicy("backoff", max_attempts=5)
    assert decide(Outcome.POISON, 1, True, policy) == Settlement(
        Action.DEAD_LETTER, 1, Outcome.POISON
    )


# --- broker_returns: x-delivery-count of quorum queues ------------------------------------------
@pytest.mark.parametrize(
    ("headers", "redelivered", "returns"),
    [
        pytest.param({}, False, 0, id="first-delivery"),
        pytest.param({}, True, 1, id="classic-redelivery-flag-only"),
        pytest.param({"x-delivery-count": 1}, True, 1, id="quorum-once"),
        pytest.param({"x-delivery-count": 4}, True, 4, id="quorum-four-returns"),
        pytest.param({"x-delivery-count": 7}, False, 0, id="publisher-set-on-first-delivery"),
        pytest.param({"x-delivery-count": "3"}, True, 1, id="string-is-not-a-count"),
        pytest.param({"x-delivery-count": True}, True, 1, id="bool-is-not-a-count"),
        pytest.param({"x-delivery-count": -2}, True, 1, id="negative"),
        pytest.param({"x-delivery-count": 0}, True, 1, id="zero-yet-redelivered"),
    ],
)
def test_broker_returns(headers: dict[str, object], redelivered: bool, returns: int) -> None:
    assert broker_returns(headers, redelivered) == returns


@pytest.mark.parametrize(
    ("header_attempts", "redelivered", "returns", "attempt"),
    [
        (0, True, 3, 4),  # three counted returns: this is the fourth delivery
        (0, True, 0, 2),  # redelivered always means at least one return
        (2, True, 2, 5),
        (0, False, 0, 1),
    ],
)
def test_attempt_number_counts_quorum_returns_in_requeue_mode(
    header_attempts: int, redelivered: bool, returns: int, attempt: int
) -> None:
    assert attempt_number(header_attempts, redelivered, REQUEUE_ONCE, returns) == attempt


def test_attempt_number_ignores_broker_returns_in_backoff_mode() -> None:
    policy = RetryPolicy("backoff", max_attempts=5)
    assert attempt_number(2, True, policy, 4) == 3
