"""amqp_lab.dedup.timeouts: PostgreSQL ending a transaction for a time limit of its own, told
apart from every other error, also under a handler's own wrapper."""

from __future__ import annotations

import psycopg
import pytest

from amqp_lab.dedup.timeouts import POOLER_TIMEOUTS, TIMEOUT_SETTINGS, server_timeout, timed_out
from amqp_lab.errors import TransactionTimedOut, TransientError

pytestmark = pytest.mark.unit


def wrapped(error: BaseException, levels: int) -> BaseException:
    """``error`` raised from inside ``levels`` handler wrappers."""
    for n in range(levels):
        try:
            raise ValueError(f"wrapper {n}") from error
        except ValueError as e:
            error = e
    return error


IDLE = psycopg.errors.IdleInTransactionSessionTimeout(
    "terminating connection due to idle-in-transaction timeout"
)


class TransactionTimeout(psycopg.errors.OperationalError):
    """PostgreSQL 17's answer (psycopg before 3.2 has no class of its own for it)."""

    sqlstate = "25P04"


OPEN = TransactionTimeout("terminating connection due to transaction timeout")


@pytest.mark.parametrize(
    ("error", "setting"),
    [
        (IDLE, "idle_in_transaction_session_timeout"),
        (OPEN, "transaction_timeout"),
        (wrapped(IDLE, 1), "idle_in_transaction_session_timeout"),
        (wrapped(OPEN, 3), "transaction_timeout"),
        (
            psycopg.errors.ProtocolViolation("idle transaction timeout"),
            "PgBouncer's idle_transaction_timeout",
        ),
    ],
)
def test_the_servers_time_limits(error: BaseException, setting: str) -> None:
    assert server_timeout(error) == setting
    assert set(POOLER_TIMEOUTS.values()) == {"PgBouncer's idle_transaction_timeout"}
    assert set(TIMEOUT_SETTINGS.values()) == {
        "idle_in_transaction_session_timeout",
        "transaction_timeout",
    }


def test_an_error_raised_while_handling_one_counts_too() -> None:
    try:
        try:
            raise IDLE
        except psycopg.Error:
            raise RuntimeError("the handler's cleanup failed") from None
    except RuntimeError as e:
        assert e.__cause__ is None and e.__context__ is IDLE
        assert server_timeout(e) == "idle_in_transaction_session_timeout"


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.OperationalError("terminating connection due to idle-in-transaction timeout"),
        wrapped(psycopg.errors.QueryCanceled("statement timeout"), 2),
        # PgBouncer's other answers on the same SQLSTATE
        psycopg.errors.ProtocolViolation("query timeout"),
        psycopg.errors.ProtocolViolation('prepared statement "_pg3_0" does not exist'),
        psycopg.errors.ProtocolViolation("idle transaction timeout, and more"),
        wrapped(IDLE, 9),  # deeper than a handler's wrappers go: not looked for
        ValueError("idle-in-transaction timeout"),
        None,
    ],
)
def test_nothing_else_is_taken_for_one(error: BaseException | None) -> None:
    assert server_timeout(error) is None


def test_timed_out_names_the_call_and_the_setting_or_is_none() -> None:
    error = timed_out("cannot claim in dedup store db", [ValueError("x"), wrapped(IDLE, 1)])
    assert isinstance(error, TransactionTimedOut) and isinstance(error, TransientError)
    assert str(error) == (
        "cannot claim in dedup store db: the database ended the transaction past its"
        " idle_in_transaction_session_timeout (the handler held it too long); nothing of it"
        " was committed"
    )
    assert timed_out("cannot claim in dedup store db", [ValueError("x")]) is None
    assert timed_out("cannot claim in dedup store db", []) is None
