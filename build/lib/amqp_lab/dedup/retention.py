"""How long dedup records are kept, and the purge that enforces it.

A claim must outlive every way its message_id can come back:

* a redelivery after a crash or a lost connection (immediate);
* the retry policy's whole horizon: in ``backoff`` mode the sum of the capped waits after
  failures 1 .. max_attempts-1 (:func:`amqp_lab.retry.wait_bound`); ``requeue`` retries at once;
* a replay from the DLQ, or a late duplicate, within the replay window an operator allows.

A record purged earlier lets a late copy run the handler a second time, so a retention window
that is not longer than horizon + replay window is refused (:func:`check_retention`). All
durations are in seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from amqp_lab.dedup import ManagedDedupStore, Purged
from amqp_lab.errors import ConfigurationError
from amqp_lab.retry.broker_held import wait_bound
from amqp_lab.retry.policy import RetryPolicy

__all__ = [
    "DAY",
    "DEFAULT_PURGE_INTERVAL",
    "DEFAULT_REPLAY_WINDOW",
    "DEFAULT_RETENTION",
    "PeriodicPurge",
    "check_retention",
    "cutoff",
    "minimum_retention",
    "purge_expired",
    "retry_horizon",
]

log = logging.getLogger(__name__)

DAY = 86400.0
DEFAULT_RETENTION = 7 * DAY
DEFAULT_REPLAY_WINDOW = 3 * DAY
DEFAULT_PURGE_INTERVAL = 3600.0


def retry_horizon(policy: RetryPolicy) -> float:
    """The longest time in seconds the broker holds a message between its first delivery and
    its last retry: 0 for ``requeue`` (immediate), else sum of ``wait_bound(policy, n)`` for
    n = 1 .. max_attempts-1."""
    if policy.mode != "backoff":
        return 0.0
    return sum(wait_bound(policy, n) for n in range(1, policy.max_attempts))


def minimum_retention(policy: RetryPolicy, replay_window: float) -> float:
    """Seconds a record must outlive: the retry horizon plus the replay window."""
    return retry_horizon(policy) + replay_window


def _days(seconds: float) -> str:
    return f"{seconds:g} s ({seconds / DAY:.4g} days)"


def check_retention(retention: float, policy: RetryPolicy, replay_window: float) -> None:
    """Raise ConfigurationError unless ``retention`` (seconds) is longer than the retry horizon
    plus ``replay_window`` (seconds); a negative replay window is an error too."""
    if replay_window < 0:
        raise ConfigurationError(f"the replay window must be >= 0, got {replay_window:g} s")
    horizon = retry_horizon(policy)
    needed = horizon + replay_window
    if not retention > needed:
        raise ConfigurationError(
            f"dedup retention of {_days(retention)} is not longer than the retry horizon "
            f"{_days(horizon)} plus the replay window {_days(replay_window)}: a copy arriving "
            f"later would be applied twice; keep records longer than {_days(needed)}"
        )


def cutoff(now: float, retention: float) -> float:
    """The purge boundary: records from before ``now - retention`` (epoch seconds) go."""
    return now - retention


def purge_expired(
    store: ManagedDedupStore, retention: float, clock: Callable[[], float] = time.time
) -> Purged:
    """Delete the store's records older than ``retention`` seconds (one DELETE transaction per
    table kind). Raises DedupStoreError."""
    return store.purge(cutoff(clock(), retention))


class PeriodicPurge:
    """A daemon thread that purges ``store`` at start and then every ``interval`` seconds.
    A failed purge is logged and tried again at the next interval; it never stops the worker.
    ``on_purge`` receives each result."""

    def __init__(
        self,
        store: ManagedDedupStore,
        retention: float,
        interval: float = DEFAULT_PURGE_INTERVAL,
        on_purge: Callable[[Purged], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval <= 0:
            raise ConfigurationError(f"purge interval must be > 0 seconds, got {interval:g}")
        self.store = store
        self.retention = retention
        self.interval = interval
        self.on_purge = on_purge or (lambda p: None)
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dedup-purge", daemon=True)

    def start(self) -> PeriodicPurge:
        """Start the thread (the first purge runs at once); return self."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread and wait up to ``timeout`` seconds for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            try:
                self.on_purge(purge_expired(self.store, self.retention, self.clock))
            except Exception as e:  # one line, never a thread traceback, never the worker's end
                log.warning("dedup purge failed (%s); retrying in %g s", e, self.interval)
            if self._stop.wait(self.interval):
                return
