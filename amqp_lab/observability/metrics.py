"""Prometheus metrics of a worker and a publisher (prometheus-client), and their /metrics
endpoint.

Names follow the Prometheus conventions (https://prometheus.io/docs/practices/naming/):
``amqp_lab_`` prefix, ``_total`` counters, ``_seconds`` durations. A worker's metrics are
labelled ``vhost`` and ``queue``, a publisher's ``vhost`` and ``exchange``. The list, what
each means and the alerts on them: docs/operating.md. The queue-side gauges (DLQ depth and
age, consumers) come from :mod:`amqp_lab.observability.queues`, scraped apart from workers:
a dead worker cannot report that nobody consumes.

Every object takes the ``registry`` to register on (default: prometheus-client's global
one); two objects with the same names need two registries.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server

from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.outbox.outcomes import Verdict
from amqp_lab.outbox.row import OutboxRow
from amqp_lab.outbox.status import OutboxStatus

__all__ = ["ConsumerMetrics", "OutboxMetrics", "PublisherMetrics", "serve_metrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Seconds: handler, store and confirm latencies, from a millisecond to half a minute."""
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500)
"""Deliveries per settled batch (``--ack-batch`` is at most the prefetch)."""
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
"""Seconds from an outbox row's due time to its confirm: milliseconds to half an hour."""


class ConsumerMetrics:
    """The :class:`~amqp_lab.consuming.observer.ConsumerObserver` of one consumer, as
    Prometheus metrics labelled ``vhost`` and ``queue``:

    * ``amqp_lab_consumer_processed_total``, ``..._duplicates_total``;
    * ``..._requeued_total`` (basic.reject requeue), ``..._retried_total{attempt}`` (a retry
      copy sent to wait queue ``attempt``);
    * ``..._dead_lettered_total{classification,error_type}``, ``..._parked_total``;
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
            "Failed deliveries sent to a wait queue (broker-held backoff), by attempt",
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
        for counter in (self.processed, self.duplicates, self.requeued, self.parked):
            counter.labels(*self._labels)  # exported as 0 from the start, not absent
        self.blocked_seconds.labels(*self._labels)
        self.reconnects.labels(*self._labels)
        self.in_flight.labels(*self._labels).set(0)

    def settled(self, report: DeliveryReport) -> None:
        """Count one settled delivery by its outcome; observe its handler time."""
        labels = self._labels
        if report.handler_seconds is not None:
            self.handler_seconds.labels(*labels).observe(report.handler_seconds)
        outcome = report.outcome
        if outcome == "processed":
            self.processed.labels(*labels).inc()
        elif outcome == "duplicate":
            self.duplicates.labels(*labels).inc()
        elif outcome == "held" or (outcome == "requeued" and report.wait is not None):
            # a retry copy into a wait queue, or (ordered consumer) an in-worker retry
            self.retried.labels(*labels, str(report.attempts)).inc()
        elif outcome == "requeued":
            self.requeued.labels(*labels).inc()
        elif outcome == "dead-lettered":
            self.dead_lettered.labels(
                *labels, report.classification or "unknown", report.error_type or "unknown"
            ).inc()
        elif outcome == "parked":
            self.parked.labels(*labels).inc()

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


class OutboxMetrics:
    """An outbox relay's metrics (the :class:`~amqp_lab.outbox.observer.RelayObserver` of
    :class:`~amqp_lab.outbox.relay.OutboxRelay`), labelled ``vhost`` (where it publishes) and
    ``outbox`` (the database, password masked):

    * ``amqp_lab_outbox_rows{state}`` (gauge): pending rows ``due`` (their time has come, not
      refused), ``scheduled`` (due_at in the future), ``failed`` (the last try refused),
      ``parked`` (refused for good; counted in failed too) - the outbox's depth;
    * ``amqp_lab_outbox_oldest_pending_age_seconds`` (gauge): how long the oldest pending row
      whose time has come has waited (0: none waits);
    * ``amqp_lab_outbox_relay_lag_seconds`` (histogram): a row's due time (its insert, or its
      due_at) to its publisher confirm;
    * ``amqp_lab_outbox_relayed_total{outcome}``: sent, refused, lost;
    * ``amqp_lab_outbox_relays`` (gauge): relays with a recent heartbeat.

    The gauges come from a status query every ``status_interval``; every relay of one outbox
    exports the same values (aggregate with ``max``)."""

    def __init__(
        self, vhost: str, outbox: str, registry: CollectorRegistry | None = REGISTRY
    ) -> None:
        labels = ("vhost", "outbox")
        self.rows = Gauge(
            "amqp_lab_outbox_rows",
            "Outbox rows not yet confirmed, by state: due, scheduled, failed, parked",
            (*labels, "state"),
            registry=registry,
        )
        self.oldest = Gauge(
            "amqp_lab_outbox_oldest_pending_age_seconds",
            "Seconds the oldest pending outbox row whose time has come has waited",
            labels,
            registry=registry,
        )
        self.lag = Histogram(
            "amqp_lab_outbox_relay_lag_seconds",
            "Seconds from an outbox row's due time (insert or due_at) to its publisher confirm",
            labels,
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self.relayed_rows = Counter(
            "amqp_lab_outbox_relayed_total",
            "Outbox rows published, by outcome: sent, refused, lost",
            (*labels, "outcome"),
            registry=registry,
        )
        self.relays = Gauge(
            "amqp_lab_outbox_relays",
            "Relays of this outbox with a recent heartbeat",
            labels,
            registry=registry,
        )
        self._labels = (vhost, outbox)
        for outcome in ("sent", "refused", "lost"):
            self.relayed_rows.labels(*self._labels, outcome)
        self.oldest.labels(*self._labels).set(0)

    def relayed(self, row: OutboxRow, verdict: Verdict, lag: float | None) -> None:
        """Count one row's outcome; observe a sent row's lag."""
        if verdict is Verdict.UNATTEMPTED:
            return
        self.relayed_rows.labels(*self._labels, verdict.value).inc()
        if lag is not None:
            self.lag.labels(*self._labels).observe(lag)

    def status(self, status: OutboxStatus) -> None:
        """Set the gauges from a status read."""
        counts = {
            "due": status.due,
            "scheduled": status.scheduled,
            "failed": status.failed,
            "parked": status.parked,
        }
        for state, count in counts.items():
            self.rows.labels(*self._labels, state).set(count)
        self.oldest.labels(*self._labels).set(status.oldest_due_age or 0.0)
        self.relays.labels(*self._labels).set(len(status.relays))


def serve_metrics(
    port: int, host: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` as ``http://host:port/metrics`` (Prometheus text format) on a
    daemon thread; returns (server, thread). Port 0 picks a free port (``server.server_port``).
    Raises OSError when the port is taken."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread
