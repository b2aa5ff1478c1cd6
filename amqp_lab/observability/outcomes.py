"""A settled delivery's outcome: the names the worker's report line, its JSON log and its
metrics share, and the shape of a report as the watchers read it (pure).

One name per thing that happened, the same in the log (``outcome=retried``) and in the
metric (``amqp_lab_consumer_retried_total``):

======================  ==========================================  =============================
outcome                 what happened                               metric
======================  ==========================================  =============================
``processed``           the handler ran, its writes committed,      ``..._processed_total``
                        acked
``duplicate``           its message_id was processed already:       ``..._duplicates_total``
                        acked without running the handler
``requeued``            returned to its queue at once               ``..._requeued_total``
                        (basic.reject requeue)
``retried``             a retry scheduled: a copy confirmed into    ``..._retried_total{attempt}``
                        wait queue ``attempt`` (backoff), or held
                        in the worker (the ordered consumer); the
                        report's ``wait`` says how long
``dead-lettered``       to the DLQ                                  ``..._dead_lettered_total``
``parked``              the DLQ would not take it: left unacked     ``..._parked_total``
======================  ==========================================  =============================

:class:`SettledReport` is what a report must offer to be logged
(:func:`amqp_lab.observability.logs.report_event`) or counted
(:class:`amqp_lab.exporters.metrics.ConsumerMetrics`):
:class:`amqp_lab.consuming.delivery.DeliveryReport` is one. Declared here, as a protocol, so
that observability and the exporters never import the consumers that use them.
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "DEAD_LETTERED",
    "DUPLICATE",
    "OUTCOMES",
    "PARKED",
    "PROCESSED",
    "REQUEUED",
    "RETRIED",
    "SettledReport",
]

PROCESSED = "processed"
DUPLICATE = "duplicate"
REQUEUED = "requeued"
RETRIED = "retried"
DEAD_LETTERED = "dead-lettered"
PARKED = "parked"
OUTCOMES = (PROCESSED, DUPLICATE, REQUEUED, RETRIED, DEAD_LETTERED, PARKED)
"""Every outcome a delivery report can have."""


class SettledReport(Protocol):
    """One settled delivery as the log and the metrics read it. Seconds for durations."""

    @property
    def message_id(self) -> str | None:
        """The message's message_id (None: it had none)."""

    @property
    def outcome(self) -> str:
        """One of :data:`OUTCOMES`."""

    @property
    def attempts(self) -> int:
        """Deliveries so far, this one included (for ``retried``: the failure it follows)."""

    @property
    def redelivered(self) -> bool:
        """The broker's redelivered flag."""

    @property
    def error(self) -> str | None:
        """``Type: message`` of a failure, None without one."""

    @property
    def wait(self) -> float | None:
        """``retried``: seconds until the retry."""

    @property
    def classification(self) -> str | None:
        """Of a failure: business, transient, unknown, poison."""

    @property
    def error_type(self) -> str | None:
        """The exception's class name."""

    @property
    def handler_seconds(self) -> float | None:
        """The handler's run time (None: it did not run)."""

    @property
    def trace_id(self) -> str | None:
        """The W3C trace id the message carried."""
