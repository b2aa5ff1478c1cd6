"""The outbox relay's Prometheus metrics (:class:`OutboxMetrics`): the exporter side of
:class:`amqp_lab.outbox.observer.RelayObserver`."""

from __future__ import annotations

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from amqp_lab.outbox.outcomes import Verdict
from amqp_lab.outbox.row import OutboxRow
from amqp_lab.outbox.status import OutboxStatus

__all__ = ["LAG_BUCKETS", "OutboxMetrics"]

disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client

LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
"""Seconds from an outbox row's due time to its confirm: milliseconds to half an hour."""


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
