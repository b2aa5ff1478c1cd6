"""The outbox's state as numbers, and what in it needs a person (pure: no I/O).

:class:`OutboxStatus` is what a relay reads every few seconds (the metrics) and what
``amqp-lab-relay status`` and ``scripts/health.py --outbox-url`` show; :func:`outbox_problems`
turns it into alert lines, like :func:`amqp_lab.health.health_problems` does for queues. The
runbook for each: docs/operating.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FailedRow", "OutboxStatus", "RelaySeen", "outbox_problems"]


@dataclass(frozen=True)
class RelaySeen:
    """A relay's heartbeat: ``relay_id``, ``host``, ``pid``, ``started_at`` and ``seen_at``
    (epoch seconds on the database's clock)."""

    relay_id: str
    host: str
    pid: int
    started_at: float
    seen_at: float


@dataclass(frozen=True)
class FailedRow:
    """A pending row whose last publish the broker refused: what an operator retries or
    discards. ``retry_at`` is None for a parked row (refused for good: unencodable or
    unreadable)."""

    message_id: str
    ordering_key: str | None
    exchange: str
    routing_key: str
    tries: int
    last_error: str
    refused_at: float | None
    retry_at: float | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (no NaN or infinity: a parked row's retry_at is null)."""
        return {
            "message_id": self.message_id,
            "ordering_key": self.ordering_key,
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "tries": self.tries,
            "last_error": self.last_error,
            "refused_at": self.refused_at,
            "retry_at": self.retry_at,
            "parked": self.retry_at is None,
        }


@dataclass(frozen=True)
class OutboxStatus:
    """The outbox at ``now`` (epoch seconds, the database's clock): ``pending`` rows not yet
    confirmed, of which ``due`` (their time has come, none refused), ``scheduled`` (due_at in
    the future), ``failed`` (the last try refused; ``parked`` of them for good);
    ``oldest_due_age`` (seconds since the oldest pending row whose time has come should have
    gone; None when there is none) and the ``relays`` whose heartbeat is recent."""

    now: float
    pending: int
    due: int
    scheduled: int
    failed: int
    parked: int
    oldest_due_age: float | None
    relays: tuple[RelaySeen, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "now": self.now,
            "pending": self.pending,
            "due": self.due,
            "scheduled": self.scheduled,
            "failed": self.failed,
            "parked": self.parked,
            "oldest_due_age": self.oldest_due_age,
            "relays": [
                {"relay_id": r.relay_id, "host": r.host, "pid": r.pid, "seen_at": r.seen_at}
                for r in self.relays
            ],
        }

    def line(self) -> str:
        """One line for people."""
        age = "-" if self.oldest_due_age is None else f"{self.oldest_due_age:.1f}s"
        return (
            f"pending={self.pending} due={self.due} scheduled={self.scheduled} "
            f"failed={self.failed} parked={self.parked} oldest_due_age={age} "
            f"relays={len(self.relays)}"
        )


def outbox_problems(
    status: OutboxStatus,
    where: str,
    max_age: float | None = 60.0,
    max_failed: int | None = 0,
    max_due: int | None = None,
    min_relays: int = 1,
) -> list[str]:
    """Alert lines for the outbox at ``where`` (empty when healthy): rows whose time has come
    waiting longer than ``max_age`` seconds (no relay running, or the broker refusing or down),
    more than ``max_failed`` refused rows (each blocks its key's later rows), more than
    ``max_due`` rows due, fewer than ``min_relays`` relays with a recent heartbeat while rows
    are pending. None turns a check off."""
    found: list[str] = []
    if (
        max_age is not None
        and status.oldest_due_age is not None
        and status.oldest_due_age > max_age
    ):
        found.append(
            f"outbox {where}: the oldest pending row has waited {status.oldest_due_age:.0f} s "
            f"(threshold {max_age:g} s); {status.pending} pending"
        )
    if max_failed is not None and status.failed > max_failed:
        found.append(
            f"outbox {where}: {status.failed} row(s) refused by the broker "
            f"({status.parked} parked for good), each holding its key's later rows: "
            "amqp-lab-relay status lists them"
        )
    if max_due is not None and status.due > max_due:
        found.append(f"outbox {where}: {status.due} rows due (threshold {max_due})")
    if status.pending and len(status.relays) < min_relays:
        found.append(
            f"outbox {where}: {len(status.relays)} relay(s) running (fewer than {min_relays}) "
            f"with {status.pending} row(s) pending"
        )
    return found
