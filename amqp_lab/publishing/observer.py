"""What a publisher tells whoever watches it (metrics), as one small protocol (pure).

:class:`~amqp_lab.publishing.blocking.Publisher` and
:class:`~amqp_lab.publishing.pipelined.PipelinedPublisher` call a :class:`PublisherObserver`;
:data:`NO_PUBLISHER_OBSERVER` does nothing and is the default. The Prometheus implementation
is :class:`amqp_lab.exporters.metrics.PublisherMetrics`.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NO_PUBLISHER_OBSERVER", "NoPublisherObserver", "PublisherObserver"]


class PublisherObserver(Protocol):
    """The events of a publisher. Durations in seconds."""

    def outcome(self, exchange: str, outcome: str) -> None:
        """One message's final outcome: confirmed, unroutable, nacked or failed."""

    def confirmed_after(self, exchange: str, seconds: float) -> None:
        """One basic.publish was confirmed (acked) ``seconds`` after it was sent."""

    def blocked(self, seconds: float) -> None:
        """The connection was blocked by a resource alarm for ``seconds``."""

    def reconnected(self) -> None:
        """A new connection replaced one that ended."""


class NoPublisherObserver:
    """An observer that does nothing (the default)."""

    def outcome(self, exchange: str, outcome: str) -> None:
        """Nothing."""

    def confirmed_after(self, exchange: str, seconds: float) -> None:
        """Nothing."""

    def blocked(self, seconds: float) -> None:
        """Nothing."""

    def reconnected(self) -> None:
        """Nothing."""


NO_PUBLISHER_OBSERVER: PublisherObserver = NoPublisherObserver()
