"""Prometheus metrics of a worker and a publisher (prometheus-client).

Names follow the Prometheus conventions (https://prometheus.io/docs/practices/naming/):
``amqp_lab_`` prefix, ``_total`` counters, ``_seconds`` durations. A worker's metrics are
labelled ``vhost`` and ``queue``, a publisher's ``vhost`` and ``exchange``. The list, what
each means and the alerts on them: docs/operating.md. A worker's outcome counters carry the
outcome names of its report lines (:mod:`amqp_lab.observability.outcomes`). The queue-side
gauges (DLQ depth and age, consumers) come from :mod:`amqp_lab.exporters.queues`, scraped
apart from workers: a dead worker cannot report that nobody consumes.

Every object takes the ``registry`` to register on (default: prometheus-client's global
one); two objects with the same names need two registries. Importing this module turns off
prometheus-client's ``_created`` series process-wide (``disable_created_metrics``): one more
series per counter and histogram child that no dashboard or alert reads.
"""

from __future__ import annotations

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from amqp_lab.observability.outcomes import (
    DEAD_LETTERED,
    DUPLICATE,
    PARKED,
    PROCESSED,
    REQUEUED,
    RETRIED,
    SettledReport,
)

__all__ = ["ConsumerMetrics", "PublisherMetrics", "process_registry"]

disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Seconds: handler, store and confirm latencies, from a millisecond to half a minute."""
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500)
"""Deliveries per settled batch (``--ack-batch`` is at most the prefetch)."""


class ConsumerMetrics:
    """The :class:`~amqp_lab.consuming.observer.ConsumerObserver` of one consumer, as
    Prometheus metrics labelled ``vhost`` and ``queue``:

    * one counter per outcome of the report lines: ``amqp_lab_consumer_processed_total``,
      ``..._duplicates_total`` (outcome ``duplicate``), ``..._requeued_total`` (basic.reject
      requeue), ``..._retried_total{attempt}`` (a retry scheduled after failure ``attempt``:
      a copy in wait queue ``attempt``, or held in the ordered worker),
      ``..._dead_lettered_total{classification,error_type}``, ``..._parked_total``;
    * ``amqp_lab_consumer_handler_duration_seconds``, ``..._ack_batch_deliveries`` (histograms);
    * ``amqp_lab_consumer_unacked_deliveries`` (gauge: received, not settled);
    * ``..._blocked_seconds_total`` (connection blocked by a resource alarm),
      ``..._reconnects_total``;
    * ``amqp_lab_dedup_store_duration_seconds{operation}``, the handler's time excluded.
    """

    def __init__(
        self, vhost: str, queue: str, registry: CollectorRegistry | None = REGISTRY
    ) -> None:
        labels = ("vhost", "queue")
        self.processed = Counter(
            "amqp_lab_consumer_processed_total",
            "Deliveries processed and acked",
            labels,
            registry=registry,
        )
        self.duplicates = Counter(
            "amqp_lab_consumer_duplicates_total",
            "Deliveries acked without running the handler: their message_id was processed",
            labels,
            registry=registry,
        )
        self.requeued = Counter(
            "amqp_lab_consumer_requeued_total",
            "Failed deliveries returned to the queue (basic.reject requeue)",
            labels,
            registry=registry,
        )
        self.retried = Counter(
            "amqp_lab_consumer_retried_total",
            "Failed deliveries retried later: a copy in a wait queue, or held in the ordered "
            "worker, by attempt",
            (*labels, "attempt"),
            registry=registry,
        )
        self.dead_lettered = Counter(
            "amqp_lab_consumer_dead_lettered_total",
            "Deliveries dead-lettered, by classification and error type",
            (*labels, "classification", "error_type"),
            registry=registry,
        )
        self.parked = Counter(
            "amqp_lab_consumer_parked_total",
            "Deliveries the DLQ would not take, left unacked",
            labels,
            registry=registry,
        )
        self.handler_seconds = Histogram(
            "amqp_lab_consumer_handler_duration_seconds",
            "Handler run time",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch = Histogram(
            "amqp_lab_consumer_ack_batch_deliveries",
            "Deliveries per settled batch (one store transaction)",
            labels,
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "amqp_lab_consumer_unacked_deliveries",
            "Deliveries received and not settled yet",
            labels,
            registry=registry,
        )
        self.blocked_seconds = Counter(
            "amqp_lab_consumer_blocked_seconds_total",
            "Seconds the connection was blocked by a memory or disk alarm",
            labels,
            registry=registry,
        )
        self.reconnects = Counter(
            "amqp_lab_consumer_reconnects_total",
            "Connections that replaced one",
            labels,
            registry=registry,
        )
        self.store_seconds = Histogram(
            "amqp_lab_dedup_store_duration_seconds",
            "Dedup store operation time, the handler's time excluded",
            (*labels, "operation"),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._labels = (vhost, queue)
        self._by_outcome = {
            PROCESSED: self.processed,
            DUPLICATE: self.duplicates,
            REQUEUED: self.requeued,
            PARKED: self.parked,
        }
        for counter in self._by_outcome.values():
            counter.labels(*self._labels)  # exported as 0 from the start, not absent
        self.blocked_seconds.labels(*self._labels)
        self.reconnects.labels(*self._labels)
        self.in_flight.labels(*self._labels).set(0)

    def settled(self, report: SettledReport) -> None:
        """Count one settled delivery by its outcome (the counter of that name; see
        :mod:`amqp_lab.observability.outcomes`); observe its handler time."""
        labels = self._labels
        if report.handler_seconds is not None:
            self.handler_seconds.labels(*labels).observe(report.handler_seconds)
        outcome = report.outcome
        if outcome == RETRIED:
            self.retried.labels(*labels, str(report.attempts)).inc()
        elif outcome == DEAD_LETTERED:
            self.dead_lettered.labels(
                *labels, report.classification or "unknown", report.error_type or "unknown"
            ).inc()
        elif outcome in self._by_outcome:
            self._by_outcome[outcome].labels(*labels).inc()

    def batch_settled(self, deliveries: int) -> None:
        """Observe one settled batch's size."""
        self.batch.labels(*self._labels).observe(deliveries)

    def unacked(self, deliveries: int) -> None:
        """Set the deliveries in flight."""
        self.in_flight.labels(*self._labels).set(deliveries)

    def reconnected(self) -> None:
        """Count a reconnect."""
        self.reconnects.labels(*self._labels).inc()

    def blocked(self, seconds: float) -> None:
        """Add a blocked period."""
        self.blocked_seconds.labels(*self._labels).inc(seconds)

    def store_call(self, operation: str, seconds: float) -> None:
        """Observe one dedup store operation."""
        self.store_seconds.labels(*self._labels, operation).observe(seconds)


class PublisherMetrics:
    """A publisher's metrics: ``amqp_lab_publisher_published_total{vhost,exchange,outcome}``
    (confirmed, unroutable, nacked, failed), ``..._confirm_duration_seconds{vhost,exchange}``
    (basic.publish to its publisher confirm), ``..._blocked_seconds_total{vhost}`` and
    ``..._reconnects_total{vhost}``. Pass it to :class:`~amqp_lab.publishing.blocking.Publisher`
    or :class:`~amqp_lab.publishing.pipelined.PipelinedPublisher`."""

    def __init__(self, vhost: str, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.vhost = vhost
        self.published = Counter(
            "amqp_lab_publisher_published_total",
            "Messages by publish outcome",
            ("vhost", "exchange", "outcome"),
            registry=registry,
        )
        self.confirm_seconds = Histogram(
            "amqp_lab_publisher_confirm_duration_seconds",
            "Seconds from basic.publish to the broker's publisher confirm",
            ("vhost", "exchange"),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.blocked_seconds = Counter(
            "amqp_lab_publisher_blocked_seconds_total",
            "Seconds the connection was blocked by a memory or disk alarm",
            ("vhost",),
            registry=registry,
        )
        self.reconnects = Counter(
            "amqp_lab_publisher_reconnects_total",
            "Connections that replaced one",
            ("vhost",),
            registry=registry,
        )
        self.blocked_seconds.labels(vhost)
        self.reconnects.labels(vhost)

    def outcome(self, exchange: str, outcome: str) -> None:
        """Count one publish's final outcome."""
        self.published.labels(self.vhost, exchange, outcome).inc()

    def confirmed_after(self, exchange: str, seconds: float) -> None:
        """Observe one confirm latency."""
        self.confirm_seconds.labels(self.vhost, exchange).observe(seconds)

    def blocked(self, seconds: float) -> None:
        """Add a blocked period."""
        self.blocked_seconds.labels(self.vhost).inc(seconds)

    def reconnected(self) -> None:
        """Count a reconnect."""
        self.reconnects.labels(self.vhost).inc()


def process_registry() -> CollectorRegistry:
    """A registry of its own with the process, platform and garbage-collector collectors
    (``process_*``, ``python_*``): what a worker or a publisher serves beside its metrics."""
    registry = CollectorRegistry()
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    return registry
