"""amqp_lab.outbox.outage: the relay's backoff while its database is out, and what it says: one
warning when it goes, a reminder every REMIND_EVERY seconds while it stays out (a relay pointed
at a database that stays read-only said so once, then nothing), one line when it is back."""

from __future__ import annotations

import logging

import pytest

from amqp_lab.errors import OutboxUnavailable
from amqp_lab.outbox.outage import REMIND_EVERY, StoreOutage

pytestmark = pytest.mark.unit


WHY = "OutboxUnavailable: cannot execute UPDATE in a read-only transaction"


def test_an_outage_warns_once_then_reminds_with_its_length_then_says_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    outage = StoreOutage(clock=lambda: now[0])
    error = OutboxUnavailable("cannot execute UPDATE in a read-only transaction")
    with caplog.at_level(logging.WARNING, "amqp_lab.outbox"):
        for _ in range(3):  # every 5 s: within the first REMIND_EVERY, no more warnings
            outage.down(error)
            assert now[0] < outage.ok_at <= now[0] + 5.0  # OUTAGE_BACKOFF: at most 5 s
            assert outage.waiting(now[0])
            now[0] += 5.0
        assert [r.getMessage() for r in caplog.records] == [
            f"the outbox database is unavailable ({WHY}); retrying"
        ]
        now[0] = 100.0 + REMIND_EVERY
        outage.down(error)
        outage.down(error)  # the same moment: reminded already
        now[0] = 100.0 + 2 * REMIND_EVERY + 1
        outage.down(error)
        outage.up()
        outage.down(error)  # a new outage: warned at once, its length from now
    lines = [r.getMessage() for r in caplog.records]
    assert lines[1:] == [
        f"the outbox database is still unavailable after {REMIND_EVERY:.0f} s ({WHY}); retrying",
        f"the outbox database is still unavailable after {2 * REMIND_EVERY + 1:.0f} s ({WHY});"
        " retrying",
        "the outbox database is back",
        f"the outbox database is unavailable ({WHY}); retrying",
    ]
    assert not outage.waiting(outage.ok_at)
