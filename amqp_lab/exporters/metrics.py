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
_CONSUMER_HELP = {
    "consumer_processed": "Deliveries processed and acked",
    "consumer_duplicates": "Deliveries acked without running the handler: their message_id "
    "was processed",
    "consumer_requeued": "Failed deliveries returned to the queue (basic.reject requeue)",
    "consumer_retried": "Failed deliveries retried later: a copy in a wait queue, or held in "
    "the ordered worker, by attempt",
    "consumer_dead_lettered": "Deliveries dead-lettered, by classification and error type",
    "consumer_parked": "Deliveries the DLQ would not take, left unacked",
    "consumer_handler_duration_seconds": "Handler run time",
    "consumer_ack_batch_deliveries": "Deliveries per settled batch (one store transaction)",
    "consumer_unacked_deliveries": "Deliveries received and not settled yet",
    "consumer_blocked_seconds": "Seconds the connection was blocked by a memory or disk alarm",
    "consumer_reconnects": "Connections that replaced one",
    "dedup_store_duration_seconds": "Dedup store operation time, the handler's time excluded",
}
"""The help text of each worker metric (its name without ``amqp_lab_`` and ``_total``)."""


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

        def counter(name: str, *extra: str) -> Counter:
            help_ = _CONSUMER_HELP[name]
            return Counter(f"amqp_lab_{name}_total", help_, (*labels, *extra), registry=registry)

        def histogram(name: str, buckets: tuple[float, ...], *extra: str) -> Histogram:
            help_ = _CONSUMER_HELP[name]
            return Histogram(
                f"amqp_lab_{name}", help_, (*labels, *extra), buckets=buckets, registry=registry
            )

        self.processed = counter("consumer_processed")
        self.duplicates = counter("consumer_duplicates")
        self.requeued = counter("consumer_requeued")
        self.retried = counter("consumer_retried", "attempt")
        self.dead_lettered = counter("consumer_dead_lettered", "classification", "error_type")
        self.parked = counter("consumer_parked")
        self.handler_seconds = histogram("consumer_handler_duration_seconds", LATENCY_BUCKETS)
        self.batch = histogram("consumer_ack_batch_deliveries", BATCH_BUCKETS)
        unacked = _CONSUMER_HELP["consumer_unacked_deliveries"]
        self.in_flight = Gauge(
            "amqp_lab_consumer_unacked_deliveries", unacked, labels, registry=registry
        )
        self.blocked_seconds = counter("consumer_blocked_seconds")
        self.reconnects = counter("consumer_reconnects")
        self.store_seconds = histogram("dedup_store_duration_seconds", LATENCY_BUCKETS, "operation")
        self._labels = labels_ = (vhost, queue)
        # the series of this consumer's labels, looked up once: labels() costs about 0.8 µs a
        # call, twice a delivery (docs/benchmarks.md); nothing here ever removes a series
        self._by_outcome = {
            PROCESSED: self.processed.labels(*labels_),
            DUPLICATE: self.duplicates.labels(*labels_),
            REQUEUED: self.requeued.labels(*labels_),
            PARKED: self.parked.labels(*labels_),
        }
        self._handler_seconds = self.handler_seconds.labels(*labels_)
        self._start_at_zero()

    def _start_at_zero(self) -> None:
        """The unlabelled-by-value series, exported as 0 from the start, not absent (the
        outcome counters and the handler-time histogram are, by being looked up in
        ``__init__``: the histogram's buckets are exported at 0 before the first delivery)."""
        for zero in (self.blocked_seconds, self.reconnects):
            zero.labels(*self._labels)
        self.in_flight.labels(*self._labels).set(0)

    def settled(self, report: SettledReport) -> None:
        """Count one settled delivery by its outcome (the counter of that name; see
        :mod:`amqp_lab.observability.outcomes`); observe its handler time."""
        if report.handler_seconds is not None:
            self._handler_seconds.observe(report.handler_seconds)
        outcome = report.outcome
        series = self._by_outcome.get(outcome)
        if series is not None:
            series.inc()
        elif outcome == RETRIED:
            self.retried.labels(*self._labels, str(report.attempts)).inc()
        elif outcome == DEAD_LETTERED:
            self.dead_lettered.labels(
                *self._labels, report.classification or "unknown", report.error_type or "unknown"
            ).inc()

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
