"""What a relay tells whoever watches it (metrics, a benchmark), and its settings (pure).

:class:`RelayObserver` is called by :class:`~amqp_lab.outbox.relay.OutboxRelay`; the
Prometheus implementation is :class:`amqp_lab.exporters.outbox_metrics.OutboxMetrics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from amqp_lab.dedup.keepalive import DEFAULT_KEEPALIVE, PgKeepalive
from amqp_lab.outbox.db import check_lock_timeout
from amqp_lab.outbox.outcomes import Verdict
from amqp_lab.outbox.row import OutboxRow
from amqp_lab.outbox.status import OutboxStatus

__all__ = ["NO_RELAY_OBSERVER", "NoRelayObserver", "RelayConfig", "RelayObserver", "RelayReport"]


_SECONDS: tuple[str, ...] = ("lease", "poll", "keep_sent", "retry_base", "retry_cap")
_SECONDS += ("status_interval", "publish_timeout", "idle_exit", "drain_timeout")


@dataclass(frozen=True)
class RelayConfig:
    """A relay's settings (seconds unless said otherwise).

    * ``batch_rows`` / ``batch_bytes``: most rows and body + header bytes leased at once (a
      row larger than ``batch_bytes`` still goes, alone); one lease reads at most twice
      ``batch_bytes`` of bodies and headers from the database (or that one larger row);
    * ``batches``: leased batches in flight at once (publishing overlaps leasing);
    * ``window``: unconfirmed publishes at once (the PipelinedPublisher's window);
    * ``lease``: how long a lease lives on the database's clock unless renewed (a relay that
      dies holds its rows that long, on PostgreSQL; renewed every third of it);
    * ``poll``: longest sleep without a wake-up (None: 2 s on PostgreSQL, which is woken by
      NOTIFY, 0.1 s on SQLite, which is not); ``listen``: LISTEN/NOTIFY on PostgreSQL;
    * ``keep_sent``: how long a sent row is kept (``sent_at`` set) before it is purged; 0
      deletes it at once;
    * ``retry_base`` / ``retry_cap``: the backoff of a row the broker refused;
    * ``status_interval``: heartbeat, status (metrics) and purge every this often;
    * ``publish_timeout``: a batch without every outcome after this is given up (its
      publisher closed: the rest count as lost and go again);
    * ``idle_exit``: stop after this long with nothing leased and nothing in flight (None:
      never);
    * ``drain_timeout``: at stop, how long to wait for the confirms in flight;
    * ``lock_timeout``: PostgreSQL, how long one of the relay's statements waits for a lock (a
      table locked by a migration or an operator, a row by a long transaction); one that
      waits longer fails, and the relay treats it as an outage: it backs off and tries again,
      its leases left to expire meanwhile; a stop then ends within :meth:`stop_bound`. At
      most :data:`~amqp_lab.outbox.db.MAX_LOCK_TIMEOUT`;
    * ``keepalive``: PostgreSQL, how the relay's connections (its loop's, its leaser's, its
      LISTEN) find out that their network is gone, when no answer would ever come
      (:mod:`amqp_lab.dedup.keepalive`: within about 30 s by default); that is an outage too.
    """

    batch_rows: int = 500
    batch_bytes: int = 16 * 1024 * 1024
    batches: int = 2
    window: int = 1000
    lease: float = 30.0
    poll: float | None = None
    listen: bool = True
    keep_sent: float = 0.0
    retry_base: float = 1.0
    retry_cap: float = 300.0
    status_interval: float = 10.0
    publish_timeout: float = 120.0
    idle_exit: float | None = None
    drain_timeout: float = 10.0
    lock_timeout: float = 10.0
    keepalive: PgKeepalive = DEFAULT_KEEPALIVE

    def __post_init__(self) -> None:
        if self.batch_rows < 1 or self.batch_bytes < 1 or self.batches < 1 or self.window < 1:
            raise ValueError("batch_rows, batch_bytes, batches and window must be >= 1")
        for name in _SECONDS:  # an infinite lease: a dead relay's rows held for good
            value = getattr(self, name)
            if value is None or math.isfinite(value) or (name, value) == ("keep_sent", math.inf):
                continue  # (keep_sent=inf: sent rows kept for ever)
            raise ValueError(f"{name} must be a finite number of seconds, not {value!r}")
        if self.drain_timeout < 0 or (self.idle_exit is not None and self.idle_exit < 0):
            raise ValueError("drain_timeout and idle_exit must be >= 0 seconds")
        if not self.lease > 0 or (self.poll is not None and not self.poll > 0):
            raise ValueError("lease and poll must be > 0 seconds")
        if self.keep_sent < 0 or self.retry_base < 0 or self.retry_cap < self.retry_base:
            raise ValueError("keep_sent and retry_base must be >= 0, retry_cap >= retry_base")
        if not self.status_interval > 0 or not self.publish_timeout > 0:
            raise ValueError("status_interval and publish_timeout must be > 0 seconds")
        check_lock_timeout(self.lock_timeout)

    def stop_bound(self) -> float:
        """Seconds within which a stopped relay ends: ``drain_timeout``, then up to three
        statements (record, release, the leaser's) each waiting for a table lock
        (``lock_timeout``) or for a dead network to be found (``keepalive.dead_after``), plus
        5 s to spare. A SQLite relay's statements wait ``busy_timeout`` (30 s) for the write
        lock instead, within the default; keepalive parameters in the outbox URL replace
        ``keepalive`` and are not counted here."""
        wait = max(self.lock_timeout, self.keepalive.dead_after)
        return self.drain_timeout + 3 * wait + 5


@dataclass(frozen=True)
class RelayReport:
    """One row's outcome, for people and programs: ``message_id``, ``key``, ``outcome``
    (sent, refused, lost), ``tries`` (leases so far), ``error`` and ``lag`` (seconds from
    the row's due time to its confirm, on the database's clock; None unless sent)."""

    message_id: str
    key: str | None
    outcome: str
    tries: int
    error: str | None = None
    lag: float | None = None

    def line(self) -> str:
        """``message_id=<id> outcome=<o> tries=<n>`` (plus key, lag or error), one line."""
        from amqp_lab.oneline import one_line

        parts = [f"message_id={one_line(self.message_id)}", f"outcome={self.outcome}"]
        parts.append(f"tries={self.tries}")
        if self.key is not None:
            parts.append(f"key={one_line(self.key)}")
        if self.lag is not None:
            parts.append(f"lag={self.lag:.3f}")
        if self.error:
            parts.append(f"error={one_line(self.error)!r}")
        return " ".join(parts)


class RelayObserver(Protocol):
    """The events of a relay."""

    def relayed(self, row: OutboxRow, verdict: Verdict, lag: float | None) -> None:
        """One leased row's outcome (not ``unattempted``); ``lag``: seconds from its due time
        to its confirm (sent only)."""

    def status(self, status: OutboxStatus) -> None:
        """The outbox's status, read every ``status_interval``."""


class NoRelayObserver:
    """An observer that does nothing (the default)."""

    def relayed(self, row: OutboxRow, verdict: Verdict, lag: float | None) -> None:
        """Nothing."""

    def status(self, status: OutboxStatus) -> None:
        """Nothing."""


NO_RELAY_OBSERVER: RelayObserver = NoRelayObserver()
