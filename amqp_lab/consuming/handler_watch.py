"""The worker's own handler-time limit: a warning, once per delivery, for a handler that has
run longer than ``ConsumerConfig.handler_warn_after`` seconds (pure but for the clock and the
log it is given; thread-safe).

Why the worker needs one: RabbitMQ 4.3 classic queues no longer enforce ``consumer_timeout``
(rabbitmq-server 4.3.0 release notes, "Consumer Timeouts are No Longer Evaluated for Classic
Queues and Streams"), so a stuck handler holds its delivery unacked for ever and nothing says
so. The watch only warns: a Python thread cannot be killed, so the handler goes on and the
delivery stays unacked until it returns. On a quorum queue with a consumer timeout (RabbitMQ
4.3+: ``x-consumer-timeout`` / policy ``consumer-timeout``) the broker cancels the consumer
past that timeout and requeues the message, which another worker can then run in parallel -
the dedup store keeps one effect. Only killing the process (SIGKILL) stops a stuck handler;
its message is then redelivered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HandlerWatch"]

log = logging.getLogger(__name__)


@dataclass
class _Running:
    message_id: str
    started: float
    running: bool = True
    warned: bool = False


class HandlerWatch:
    """Which handlers run since when, and a warning for each past ``warn_after`` seconds
    (None: never). :meth:`started` / :meth:`finished` are called on the handler threads around
    each handler call, :meth:`check` on the consumer's I/O thread (it pumps the connection at
    least every 0.25 s), :meth:`forget` once the delivery's unit is done. ``clock``: monotonic
    seconds; ``warn``: ``logging.warning``-like."""

    def __init__(
        self,
        warn_after: float | None,
        queue: str,
        clock: Callable[[], float] = time.monotonic,
        warn: Callable[..., None] = log.warning,
    ) -> None:
        self.warn_after = warn_after
        self.queue = queue
        self.clock = clock
        self.warn = warn
        self._lock = threading.Lock()
        self._running: dict[int, _Running] = {}  # key: the caller's delivery key

    def started(self, key: int, message_id: str) -> None:
        """A handler call for delivery ``key`` begins (again, after a store outage: the
        delivery keeps its first start time and is warned about once)."""
        if self.warn_after is None:
            return
        with self._lock:
            entry = self._running.get(key)
            if entry is None:
                self._running[key] = _Running(message_id, self.clock())
            else:
                entry.running = True

    def finished(self, key: int) -> None:
        """The handler call for ``key`` returned or raised."""
        if self.warn_after is None:
            return
        with self._lock:
            entry = self._running.get(key)
            if entry is not None:
                entry.running = False

    def forget(self, keys: list[int]) -> None:
        """The deliveries' unit is done: drop them."""
        if self.warn_after is None:
            return
        with self._lock:
            for key in keys:
                self._running.pop(key, None)

    def check(self) -> int:
        """Warn about every handler running past ``warn_after`` not warned about yet; return
        how many warnings this call gave."""
        if self.warn_after is None:
            return 0
        now = self.clock()
        with self._lock:
            late = [
                e
                for e in self._running.values()
                if e.running and not e.warned and now - e.started >= self.warn_after
            ]
            for entry in late:
                entry.warned = True
        for entry in late:
            self.warn(
                "handler of message_id=%s on queue %r has run for %.1f s (handler_warn_after "
                "%g s); it is not stopped: the delivery stays unacked until it returns",
                entry.message_id,
                self.queue,
                now - entry.started,
                self.warn_after,
            )
        return len(late)
