"""The relay's outages of its database: the backoff between tries while the store raises
OutboxUnavailable, one warning when it goes down and one when it is back."""

from __future__ import annotations

import logging
import time

from amqp_lab.outbox.outcomes import describe
from amqp_lab.retry.policy import Backoff

__all__ = ["OUTAGE_BACKOFF", "StoreOutage"]

OUTAGE_BACKOFF = Backoff(base=0.2, cap=5.0)
"""Between the relay's tries of its database during an outage: 0.2 s doubling, at most 5 s."""

log = logging.getLogger("amqp_lab.outbox.relay")


class StoreOutage:
    """Where the relay stands with its database. After the n-th failure in a row the next try
    waits :data:`OUTAGE_BACKOFF` (full jitter, at least 50 ms); :attr:`ok_at` is when it may
    try again (monotonic seconds)."""

    def __init__(self) -> None:
        self.failures = 0
        self.ok_at = 0.0

    def down(self, error: BaseException) -> None:
        """A store call raised ``error`` (OutboxUnavailable): back off; warn on the first."""
        self.failures += 1
        delay = OUTAGE_BACKOFF.wait(min(self.failures, 8))
        self.ok_at = time.monotonic() + max(0.05, delay)
        if self.failures == 1:
            log.warning("the outbox database is unavailable (%s); retrying", describe(error))

    def up(self) -> None:
        """A store call succeeded: the backoff starts over; say so after an outage."""
        if self.failures:
            log.warning("the outbox database is back")
        self.failures = 0

    def waiting(self, now: float) -> bool:
        """Whether the backoff still runs at ``now`` (monotonic seconds)."""
        return now < self.ok_at
