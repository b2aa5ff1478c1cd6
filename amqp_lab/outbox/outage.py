"""The relay's outages of its database: the backoff between tries while the store raises
OutboxUnavailable, one warning when it goes down, one every :data:`REMIND_EVERY` seconds while
it stays down (a database that stays read-only - a relay pointed at a standby - would
otherwise say so once, then nothing), and one when it is back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from amqp_lab.outbox.outcomes import describe
from amqp_lab.retry.policy import Backoff

__all__ = ["OUTAGE_BACKOFF", "REMIND_EVERY", "StoreOutage"]

OUTAGE_BACKOFF = Backoff(base=0.2, cap=5.0)
"""Between the relay's tries of its database during an outage: 0.2 s doubling, at most 5 s."""
REMIND_EVERY = 60.0
"""Seconds between the warnings of one outage, after its first."""

log = logging.getLogger("amqp_lab.outbox.relay")


class StoreOutage:
    """Where the relay stands with its database. After the n-th failure in a row the next try
    waits :data:`OUTAGE_BACKOFF` (full jitter, at least 50 ms); :attr:`ok_at` is when it may
    try again (monotonic seconds). ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = 0
        self.ok_at = 0.0
        self._clock = clock
        self._since = self._warned = 0.0

    def down(self, error: BaseException) -> None:
        """A store call raised ``error`` (OutboxUnavailable): back off; warn on the first, and
        again every :data:`REMIND_EVERY` seconds with the outage's length and last error."""
        now = self._clock()
        self.failures += 1
        delay = OUTAGE_BACKOFF.wait(min(self.failures, 8))
        self.ok_at = now + max(0.05, delay)
        if self.failures == 1:
            self._since = self._warned = now
            log.warning("the outbox database is unavailable (%s); retrying", describe(error))
        elif now - self._warned >= REMIND_EVERY:
            self._warned = now
            log.warning(
                "the outbox database is still unavailable after %.0f s (%s); retrying",
                now - self._since,
                describe(error),
            )

    def up(self) -> None:
        """A store call succeeded: the backoff starts over; say so after an outage."""
        if self.failures:
            log.warning("the outbox database is back")
        self.failures = 0

    def waiting(self, now: float) -> bool:
        """Whether the backoff still runs at ``now`` (monotonic seconds)."""
        return now < self.ok_at
