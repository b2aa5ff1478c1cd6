"""What a consumer tells whoever watches it (metrics), as one small protocol (pure).

:class:`~amqp_lab.consuming.consumer.Consumer` and
:class:`~amqp_lab.ordering.OrderedConsumer` call a :class:`ConsumerObserver` at the points an
operator cares about; :data:`NO_OBSERVER` does nothing and is the default, so a consumer
without metrics pays one method call per event. The Prometheus implementation is
:class:`amqp_lab.exporters.metrics.ConsumerMetrics`; this module imports no metrics library.

Calls come from the consumer's I/O thread, except :meth:`ConsumerObserver.store_call`, which
handler threads make: implementations must be thread-safe.
"""

from __future__ import annotations

from typing import Protocol

from amqp_lab.consuming.delivery import DeliveryReport

__all__ = ["NO_OBSERVER", "ConsumerObserver", "NoObserver"]


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
