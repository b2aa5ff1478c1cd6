"""amqp_lab.outbox.pg_session: the outbox's session settings go in libpq's startup options,
never in a SET a connection pooler would hand to another client."""

from __future__ import annotations

import psycopg
import pytest

from amqp_lab.outbox.pg_session import (
    RELAY_SETTINGS,
    lock_timeout_value,
    refused,
    startup_options,
)

pytestmark = pytest.mark.unit

URL = "postgresql://app:secret@db.example/app"


def test_a_relays_settings_and_its_lock_timeout_are_startup_options() -> None:
    settings = [("lock_timeout", "10000ms"), *RELAY_SETTINGS]
    assert startup_options(settings, URL, {}) == {
        "options": "-c lock_timeout=10000ms -c synchronous_commit=off"
        " -c enable_bitmapscan=off -c enable_seqscan=off -c jit=off"
    }


def test_the_urls_own_options_come_after_ours_so_they_win() -> None:
    url = f"{URL}?options=-c%20search_path%3Dtenant_7%20-c%20lock_timeout%3D3s"
    assert startup_options([("lock_timeout", "10000ms")], url, {}) == {
        "options": "-c lock_timeout=10000ms -c search_path=tenant_7 -c lock_timeout=3s"
    }
    assert startup_options([("lock_timeout", "1ms")], "host=db options='-c work_mem=64MB'") == {
        "options": "-c lock_timeout=1ms -c work_mem=64MB"
    }


def test_pgoptions_is_kept_as_libpq_would_use_it_only_without_options_in_the_url() -> None:
    environ = {"PGOPTIONS": "-c search_path=tenant_7"}
    assert startup_options([("lock_timeout", "1ms")], URL, environ) == {
        "options": "-c lock_timeout=1ms -c search_path=tenant_7"
    }
    url = f"{URL}?options=-c%20work_mem%3D64MB"
    assert startup_options([("lock_timeout", "1ms")], url, environ) == {
        "options": "-c lock_timeout=1ms -c work_mem=64MB"
    }
    assert startup_options([("lock_timeout", "1ms")], URL, {}) == {"options": "-c lock_timeout=1ms"}


def test_no_settings_no_options_whatever_the_url_says() -> None:
    assert startup_options([], f"{URL}?options=-c%20work_mem%3D64MB") == {}


def test_a_setting_that_would_split_or_escape_the_options_is_refused() -> None:
    for name, value in (("lock_timeout", "1 s"), ("search_path", "a\\b"), ("x y", "1")):
        with pytest.raises(ValueError, match="space or a backslash"):
            startup_options([(name, value)], URL)


def test_a_conninfo_libpq_cannot_parse_raises_psycopgs_error() -> None:
    with pytest.raises(psycopg.ProgrammingError):
        startup_options([("lock_timeout", "1ms")], "host=db dbname")


def test_lock_timeout_is_whole_milliseconds_never_zero() -> None:
    assert lock_timeout_value(10.0) == "10000ms"
    assert lock_timeout_value(0.0004) == "1ms"  # 0 would mean no timeout at all
    assert lock_timeout_value(2.5) == "2500ms"


def test_pgbouncers_refusal_is_recognised_and_nothing_else_is() -> None:
    pooler = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 6432 failed:'
        " FATAL:  unsupported startup parameter: options"
    )
    assert refused(pooler)
    assert not refused(psycopg.OperationalError("connection refused"))
    assert not refused(psycopg.OperationalError('FATAL:  database "app" does not exist'))
