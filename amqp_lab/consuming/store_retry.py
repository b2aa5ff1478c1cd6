"""Riding out a dedup store outage: retry while the store is unavailable, within a bound.

A lost PostgreSQL connection or a SQLite file locked past its timeout raises
:class:`~amqp_lab.errors.StoreUnavailable`: nothing of that transaction was committed, so the
delivery is simply tried again (its handler runs again; its writes were rolled back). Only an
outage longer than the bound ends the consumer, with nothing acked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
)

from amqp_lab.errors import DedupStoreError, StoreUnavailable
from amqp_lab.retry.policy import Backoff

__all__ = ["STORE_BACKOFF", "StoreRetry"]

STORE_BACKOFF = Backoff(base=0.2, cap=5.0)
"""Between tries of a store operation during an outage: 0.2 s doubling, at most 5 s."""

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreRetry:
    """Calls store operations, retried with capped full-jitter backoff (0.2 s doubling, at most
    5 s apart) while they raise StoreUnavailable, for at most ``outage`` seconds. A drain
    (SIGTERM) does not cut it short - the handler in flight is to finish and commit - but a
    second signal ends the process at once."""

    def __init__(self, outage: float) -> None:
        self.outage = outage

    def call(self, operation: Callable[[], T]) -> T:
        """``operation()``; raises DedupStoreError when the store stayed unavailable past the
        bound, and whatever else ``operation`` raises, unchanged."""
        retrying = Retrying(
            retry=retry_if_exception_type(StoreUnavailable),
            stop=stop_after_delay(self.outage),
            wait=STORE_BACKOFF.tenacity(),
            before_sleep=_warn,
            reraise=True,
        )
        try:
            return retrying(operation)
        except StoreUnavailable as e:
            raise DedupStoreError(
                f"the dedup store stayed unavailable for {self.outage:g} s ({e}); nothing was "
                "acked, the deliveries will be redelivered"
            ) from e


def _warn(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.warning("dedup store unavailable (%s); retrying", error)
