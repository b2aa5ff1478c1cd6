"""What a consumer tells whoever watches it (metrics), as one small protocol (pure).

:class:`~amqp_lab.consuming.consumer.Consumer` and
:class:`~amqp_lab.ordering.OrderedConsumer` call a :class:`ConsumerObserver` at the points an
operator cares about; :data:`NO_OBSERVER` does nothing and is the default, so a consumer
without metrics pays one method call per event. The Prometheus implementation is
:class:`amqp_lab.observability.metrics.ConsumerMetrics`; this module imports no metrics library.

Calls come from the consumer's I/O thread, except :meth:`ConsumerObserver.store_call`, which
handler threads make: implementations must be thread-safe.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from amqp_lab.consuming.delivery import DeliveryReport

__all__ = ["NO_OBSERVER", "ConsumerObserver", "NoObserver", "guarded", "guarded_call"]

log = logging.getLogger(__name__)
ObserverT = TypeVar("ObserverT")


class ConsumerObserver(Protocol):
    """The events of one consumer's life. Durations in seconds."""

    def settled(self, report: DeliveryReport) -> None:
        """A delivery was settled (or parked): its report, with outcome, classification,
        error type, attempts and handler seconds."""

    def batch_settled(self, deliveries: int) -> None:
        """A unit of ``deliveries`` (one store transaction, one ack batch) was settled."""

    def unacked(self, deliveries: int) -> None:
        """Deliveries received from the broker and not settled yet, now."""

    def reconnected(self) -> None:
        """A new connection replaced one that ended (not counted for the first)."""

    def blocked(self, seconds: float) -> None:
        """The connection was blocked (connection.blocked: a memory or disk alarm) for
        ``seconds``, counted when it is unblocked or closes."""

    def store_call(self, operation: str, seconds: float) -> None:
        """One dedup store operation (``process_once``, ``is_processed``...) took
        ``seconds``, handler time excluded. Called on handler threads."""


class NoObserver:
    """An observer that does nothing (the default)."""

    def settled(self, report: DeliveryReport) -> None:
        """Nothing."""

    def batch_settled(self, deliveries: int) -> None:
        """Nothing."""

    def unacked(self, deliveries: int) -> None:
        """Nothing."""

    def reconnected(self) -> None:
        """Nothing."""

    def blocked(self, seconds: float) -> None:
        """Nothing."""

    def store_call(self, operation: str, seconds: float) -> None:
        """Nothing."""


NO_OBSERVER: ConsumerObserver = NoObserver()


def guarded_call(method: Callable[..., None]) -> Callable[..., None]:
    """``method`` made harmless: an exception it raises is logged (a warning, the exception's
    type and text) and swallowed. Watching must never change how a delivery is settled or what
    a publish returns: an observer runs inside settlement and confirm paths."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except Exception as e:
            log.warning(
                "observer %s raised (ignored): %s: %s", method.__name__, type(e).__name__, e
            )

    return call


class _Guarded:
    """An observer whose every public method is :func:`guarded_call`-wrapped."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name.startswith("_") or not callable(attribute):
            return attribute
        wrapped = guarded_call(attribute)
        setattr(self, name, wrapped)  # looked up once per method
        return wrapped


def guarded(observer: ObserverT) -> ObserverT:
    """``observer`` with every method call guarded (:func:`guarded_call`); the do-nothing
    observers are returned as they are. Used by the consumers and publishers on what they are
    given, so a buggy observer is a log line, not a lost or repeated message."""
    if type(observer).__name__ in ("NoObserver", "NoPublisherObserver"):
        return observer
    return _Guarded(observer)  # type: ignore[return-value]
