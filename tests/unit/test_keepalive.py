"""amqp_lab.dedup.keepalive: the libpq keepalive parameters every one of our PostgreSQL
connections sets, so a dead network fails a call instead of hanging it (psycopg2#561, #1017)."""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest

from amqp_lab.dedup.keepalive import DEFAULT_KEEPALIVE, MAX_USER_TIMEOUT, PgKeepalive
from amqp_lab.outbox.observer import RelayConfig

pytestmark = pytest.mark.unit

URL = "postgresql://app:secret@db.example:5432/app"


def test_the_default_finds_a_dead_link_within_about_thirty_seconds() -> None:
    assert DEFAULT_KEEPALIVE.params(URL) == {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 30000,
    }
    assert DEFAULT_KEEPALIVE.dead_after == 30.0
    assert PgKeepalive(idle=20, interval=10, count=4, user_timeout=5).dead_after == 60.0


def test_what_the_url_sets_itself_wins() -> None:
    url = f"{URL}?keepalives_idle=60&tcp_user_timeout=0&connect_timeout=3"
    assert DEFAULT_KEEPALIVE.params(url) == {
        "keepalives": 1,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    assert DEFAULT_KEEPALIVE.params("host=db dbname=app keepalives=0") == {
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 30000,
    }


def test_user_timeout_goes_to_libpq_in_whole_milliseconds_at_least_one() -> None:
    assert PgKeepalive(user_timeout=2.5).params(URL)["tcp_user_timeout"] == 2500
    assert PgKeepalive(user_timeout=0.0001).params(URL)["tcp_user_timeout"] == 1
    assert PgKeepalive(user_timeout=MAX_USER_TIMEOUT).params(URL)["tcp_user_timeout"] == 2**31 - 1


@pytest.mark.parametrize(
    "bad",
    [
        {"idle": 0},
        {"interval": -1},
        {"count": 0},
        {"idle": 1.5},
        {"count": True},
        {"interval": "5"},
        {"user_timeout": 0},
        {"user_timeout": -1.0},
        {"user_timeout": math.nan},
        {"user_timeout": math.inf},
        {"user_timeout": MAX_USER_TIMEOUT + 0.001},
        {"user_timeout": "30"},
        {"user_timeout": True},
    ],
)
def test_values_libpq_or_the_kernel_would_refuse_are_refused_here(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="keepalive"):
        PgKeepalive(**bad)


def test_a_conninfo_libpq_cannot_parse_raises_psycopgs_error() -> None:
    with pytest.raises(psycopg.ProgrammingError):
        DEFAULT_KEEPALIVE.params("host=db dbname")


def test_a_relay_carries_its_keepalive() -> None:
    assert RelayConfig().keepalive == DEFAULT_KEEPALIVE
    fast = PgKeepalive(idle=1, interval=1, count=2, user_timeout=3)
    assert RelayConfig(keepalive=fast).keepalive is fast


def test_a_relays_stop_bound_covers_a_table_lock_or_a_dead_network_for_three_statements() -> None:
    # default: 10 s drain + 3 x max(10 s lock, 30 s dead link) + 5 s
    assert RelayConfig().stop_bound() == 105.0
    slow_lock = RelayConfig(lock_timeout=60.0, drain_timeout=2.0)
    assert slow_lock.stop_bound() == 2.0 + 3 * 60.0 + 5
    fast = PgKeepalive(idle=1, interval=1, count=1, user_timeout=2.0)
    assert RelayConfig(keepalive=fast, lock_timeout=1.0).stop_bound() == 10.0 + 3 * 2.0 + 5
