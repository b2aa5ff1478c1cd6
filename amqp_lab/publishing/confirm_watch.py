"""When a publisher stops waiting for a publisher confirm and gives its connection up.

A RabbitMQ node on the minority side of a network partition keeps its client connections and
their heartbeats alive, accepts every basic.publish and confirms none of them until the
partition heals: the quorum queue's leader is on the other side, or has no quorum (measured on
RabbitMQ 4.3, docs/cluster.md#partitions). Heartbeats cannot tell; only the confirms' silence
can. :class:`ConfirmWatch` decides when that silence has lasted ``timeout`` seconds, so the
publisher drops the connection and republishes what is unconfirmed on the next node of its
address list (same message_id: a duplicate is possible, the consumer's dedup absorbs it).

Pure logic: times come from ``clock`` (monotonic seconds); the publisher owns the I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ConfirmWatch"]


class ConfirmWatch:
    """``timeout``: seconds without any progress while a publish is unconfirmed (None: wait
    forever, the behaviour before this existed). Progress is a basic.ack or basic.nack, the end
    of a connection.blocked period, or a new connection (:meth:`progress`). A blocked
    connection is never overdue: ``blocked_connection_timeout`` is its own limit
    (https://www.rabbitmq.com/docs/connection-blocked). Raises ValueError for a timeout <= 0.
    """

    def __init__(
        self, timeout: float | None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"confirm_timeout must be > 0 seconds or None, not {timeout!r}")
        self.timeout = timeout
        self.clock = clock
        self.progress_at = clock()

    @property
    def interval(self) -> float | None:
        """Seconds between two looks (a quarter of the timeout, at most 1 s); None: no looks."""
        return None if self.timeout is None else min(1.0, self.timeout / 4)

    def progress(self) -> None:
        """A confirm arrived, a blocked period ended or a connection opened: the clock restarts."""
        self.progress_at = self.clock()

    def overdue(self, oldest_sent_at: float | None, blocked: bool) -> bool:
        """True once ``timeout`` seconds have passed since the later of the oldest unconfirmed
        publish (``oldest_sent_at``, on ``clock``; None: nothing is unconfirmed) and the last
        progress, on a connection that is not ``blocked``."""
        if self.timeout is None or oldest_sent_at is None or blocked:
            return False
        return self.clock() - max(oldest_sent_at, self.progress_at) >= self.timeout
