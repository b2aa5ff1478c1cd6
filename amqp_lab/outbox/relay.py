"""The relay: publishes committed outbox rows with publisher confirms and ``mandatory``.

One loop on one thread (on PostgreSQL its leases run ahead on a thread of their own,
:class:`~amqp_lab.outbox.leaser.Leaser`): lease a batch
(:meth:`~amqp_lab.outbox.store.OutboxStore.lease`), hand each chain's first row to a
:class:`~amqp_lab.publishing.pipelined.PipelinedPublisher` (its confirm callbacks come back
through a queue), hand a key's next row over once the previous one is confirmed
(:class:`~amqp_lab.outbox.chains.ChainRun`), and record every row's outcome once its batch is
settled (:meth:`~amqp_lab.outbox.store.OutboxStore.complete`).
Up to ``batches`` batches are in flight, so leasing and recording overlap publishing.

What else can happen, and what then (docs/outbox.md, docs/failure-model.md):

* the database is down, restarts, drops off the network (found by ``keepalive``) or holds a
  lock on the table past ``lock_timeout``: the store call raises OutboxUnavailable; the relay
  retries with backoff and keeps its batches' outcomes until it can record them (a lease it
  cannot renew expires: another relay publishes those rows again, a duplicate);
* the broker closes, blocks or restarts: the publisher republishes what is unconfirmed (same
  message_id) or fails it; a failed publisher is replaced after a backoff; rows without an
  answer are ``lost`` and leased again; the credentials or the vhost refused are fatal;
* the broker refuses a row: it stays with its error and holds its key's later rows only;
* the relay is stopped: it waits ``drain_timeout`` for the confirms in flight, records, and
  releases its leases (a table lock or a dead network: within ``RelayConfig.stop_bound()``);
  killed, its leases expire (SQLite: the next relay releases them).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from amqp_lab.errors import OutboxError, OutboxUnavailable
from amqp_lab.outbox.flight import Flight
from amqp_lab.outbox.leaser import HeldBack, Leaser, LeaseRequest, stale_chains
from amqp_lab.outbox.observer import NO_RELAY_OBSERVER, RelayConfig, RelayObserver, RelayReport
from amqp_lab.outbox.outage import StoreOutage
from amqp_lab.outbox.outcomes import describe
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.outbox.wake import NotifyListener, RelayLock
from amqp_lab.publishing.observer import NO_PUBLISHER_OBSERVER, PublisherObserver
from amqp_lab.settings import BrokerSettings

__all__ = ["OutboxRelay"]

log = logging.getLogger(__name__)


class OutboxRelay:
    """Relay the outbox at ``outbox`` (a SQLite path, ``sqlite:///PATH`` or a PostgreSQL URL)
    to the broker of ``settings`` until :meth:`stop` (or ``config.idle_exit``).
    ``observer`` gets each row's outcome and the status; ``publisher_observer`` the
    publisher's events (:class:`~amqp_lab.exporters.metrics.PublisherMetrics`);
    ``on_report`` a :class:`~amqp_lab.outbox.observer.RelayReport` per row settled;
    ``clock``: SQLite's time (epoch seconds)."""

    def __init__(
        self,
        settings: BrokerSettings,
        outbox: str | Path,
        config: RelayConfig | None = None,
        *,
        observer: RelayObserver = NO_RELAY_OBSERVER,
        publisher_observer: PublisherObserver = NO_PUBLISHER_OBSERVER,
        on_report: Callable[[RelayReport], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.outbox, self.clock = settings, outbox, clock
        self.config = config = config or RelayConfig()
        self.observer, self.publisher_observer = observer, publisher_observer
        self.relay_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stop_reason: str | None = None
        self.failure: BaseException | None = None
        self._stopping, self._wake, self._notified = (threading.Event() for _ in range(3))
        self.flight = Flight(config, observer, on_report, self._on_outcome)
        self._store: OutboxStore | None = None
        self._listener: NotifyListener | None = None
        self._lock: RelayLock | None = None
        self._next_lease = self._ahead_after = 0.0  # monotonic: lease (ahead) from then on
        self._outage = StoreOutage()
        self._next_status = self._next_renew = self._started = 0.0
        self._thread: threading.Thread | None = None
        self._leaser = Leaser(None, self._on_outcome)  # inline until _open knows the database
        self._recorded_since_lease = False  # a batch recorded while a lease was out
        self._held_back = HeldBack()
        # a lease failed part way: on a relay's session each statement commits on its own, so
        # heads leased before the failure stay leased to this relay until released
        self._release_owed = False

    @property
    def sent(self) -> int:
        """Rows the broker confirmed."""
        return self.flight.sent

    @property
    def refused(self) -> int:
        """Publishes the broker refused."""
        return self.flight.refused

    @property
    def lost(self) -> int:
        """Publishes without an answer (to go again)."""
        return self.flight.lost

    # --- control ---------------------------------------------------------------------------
    def stop(self, reason: str = "stopped") -> None:
        """Stop from any thread: no new lease; the confirms in flight are awaited up to
        ``drain_timeout``, outcomes recorded, leases released."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stopping.set()
        self._wake.set()

    def start_thread(self, on_fatal: Callable[[BaseException], None] | None = None) -> None:
        """Run on a daemon thread; a fatal error lands in :attr:`failure` and ``on_fatal``."""

        def target() -> None:
            try:
                self.run()
            except BaseException as e:  # the thread's end: hand it over, never lose it
                self.failure = e
                log.error("the outbox relay stopped: %s", describe(e))
                if on_fatal is not None:
                    on_fatal(e)

        self._thread = threading.Thread(target=target, name="amqp-lab-outbox-relay", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the thread :meth:`start_thread` started still runs."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread :meth:`start_thread` started."""
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def in_flight(self) -> int:
        """Rows leased and not yet recorded."""
        return len(self.flight.held())

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Relay until stopped; returns the rows sent. Raises AuthenticationFailed /
        VhostAccessDenied (the broker refused the relay), OutboxError (the outbox cannot be
        used: not an outage), ConfigurationError."""
        self._started = self.clock()
        idle_since, idle = time.monotonic(), self.config.idle_exit
        try:
            self._open()
            while not self._stopping.is_set():
                self._wake.clear()
                busy = self.flight.take_outcomes()
                busy = self._leased() or busy  # a batch leased ahead goes before a record
                busy = self._record() or busy
                busy = self._lease() or busy
                self._housekeeping()
                now = time.monotonic()
                if busy or self.flight.batches or self.flight.unrecorded:
                    idle_since = now
                elif idle is not None and now - idle_since >= idle and not self._leaser.pending:
                    self.stop(f"idle for {idle:g} s")
                    break
                if not busy:
                    self._wake.wait(self._sleep_for(now))
        finally:
            self._shutdown()
        return self.sent

    def _open(self) -> None:
        """The store (retried while the database is unreachable), the listener, the lock."""
        while self._store is None and not self._stopping.is_set():
            try:
                self._store = self._open_store()
            except OutboxUnavailable as e:
                self._outage.down(e)
                self._stopping.wait(max(0.0, self._outage.ok_at - time.monotonic()))
        store = self._store
        if store is None:
            return
        if store.dialect == "postgresql" and self.config.listen and not store.pooled:
            keep = self.config.keepalive  # idle: only probes find it dead; no LISTEN via a pooler
            self._listener = NotifyListener(store.target, self._on_notify, keepalive=keep).start()
        if store.lock_path is not None:
            self._lock = RelayLock(store.lock_path)
        else:  # PostgreSQL: leases ahead of the loop, on a connection of their own
            self._leaser = Leaser(self._open_store, self._on_outcome)

    def _open_store(self) -> OutboxStore:  # the loop's and the leaser's, on their connections
        return OutboxStore(
            self.outbox,
            self.clock,
            relay_session=True,
            lock_timeout=self.config.lock_timeout,
            keepalive=self.config.keepalive,
        )

    def _on_outcome(self) -> None:
        """Once per publish outcome, or lease result: wake the loop unless it is awake already
        (it clears the event before taking outcomes; Event.set locks and notifies each time)."""
        if not self._wake.is_set():
            self._wake.set()

    def _on_notify(self) -> None:
        """On the listener's thread: a transaction that added rows committed."""
        self._notified.set()
        self._wake.set()

    def _sleep_for(self, now: float) -> float:
        deadlines = [self._next_status, now + 1.0]
        if not self._leaser.pending:  # else the lease's result wakes the loop
            deadlines.append(self._next_lease)
        if self.flight.batches:
            deadlines.append(self._next_renew)
        return max(0.001, min(deadlines) - now)

    # --- outcomes --------------------------------------------------------------------------------
    def _record(self) -> bool:
        """Record finished batches' outcomes, oldest first; False when the store is down."""
        store = self._store
        waiting = self.flight.unrecorded
        if not waiting or store is None or self._outage.waiting(time.monotonic()):
            return False
        while waiting:
            results = list(waiting[0].results.values())
            try:
                store.complete(self.relay_id, results, self.config.keep_sent > 0)
            except OutboxUnavailable as e:
                self._outage.down(e)
                return False
            self._outage.up()
            waiting.pop(0)
            self._next_lease = 0.0  # the keys it held may have rows ready now
            self._recorded_since_lease = True
        return True

    # --- leasing and publishing ----------------------------------------------------------------
    def _lease(self) -> bool:
        """Submit a lease when none is out and something may be due: for a batch to start now,
        or ahead with every batch in flight (PostgreSQL's leaser thread; due heads only)."""
        store, now = self._store, time.monotonic()
        ahead = len(self.flight.batches) >= self.config.batches  # its batch waits for room
        if (
            store is None
            or self._stopping.is_set()
            or self._leaser.pending
            or (ahead and (not self._leaser.threaded or now < self._ahead_after))
            or self._outage.waiting(now)
            or (now < self._next_lease and not self._notified.is_set())
            or not self._hold_lock(store)
            or not self._release_leftovers(store)
            or not self.flight.ensure_publisher(self.settings, self.publisher_observer)
        ):
            return False
        self._notified.clear()
        self._recorded_since_lease = False
        self.flight.failed_keys.clear()
        cfg = self.config
        request = LeaseRequest(
            self.relay_id,
            cfg.lease,
            cfg.batch_rows,
            cfg.batch_bytes,
            tuple(self.flight.held()),
            tuple(self.flight.held_keys()) + self._held_back.keys(now),
            self.flight.tails(),
            ahead,
        )
        self._leaser.submit(store, request)
        return self._leased()

    def _leased(self) -> bool:
        """Start the batch of the lease that came back, if one did and there is room (one taken
        ahead waits); whether one started. Raises the store's error unless an outage."""
        if len(self.flight.batches) >= self.config.batches or not self._leaser.pending:
            return False
        if not self.flight.ensure_publisher(self.settings, self.publisher_observer):
            return False  # a batch leased ahead waits for a working publisher (renewed)
        result = self._leaser.take()
        if result is None:
            return False
        if result.error is not None:
            if isinstance(result.error, OutboxUnavailable):
                self._outage.down(result.error)
                self._release_owed = True
                return False
            raise result.error
        self._outage.up()
        if self._stopping.is_set():
            return False  # its rows are released with the rest (release_all)
        now, cfg, lease = time.monotonic(), self.config, result.lease
        store = self._store
        poll = self._poll(store) if store is not None else 1.0
        self._held_back.add(lease.blocked, now, min(1.0, poll), extend=lease.more_behind)
        if not lease.rows:
            if result.request.ahead:  # no head within its reach: none ahead for a while
                self._ahead_after = now + min(1.0, poll)
            # nothing leasable: lease again at the next due time if it comes before the poll.
            # Rows due already are held - behind a key's leased head, or leased - and become
            # leasable only when a batch is recorded (which leases at once) or another
            # relay's lease expires (the poll): leasing in between would spin on the database
            wait = result.next_due
            ahead = poll if wait is None or wait <= 0 else min(poll, wait)
            again = self._recorded_since_lease or lease.more_behind  # the window was full
            self._next_lease = 0.0 if again else now + ahead
            return False
        if not self.flight.batches:
            self._next_renew = now + cfg.lease / 3
        if lease.more_behind:  # the window was full: what lies beyond it is for the next lease
            self._next_lease = 0.0
        elif len(lease.rows) < cfg.batch_rows and not self._recorded_since_lease:
            # the due rows are exhausted (or lie past an ahead lease's reach): the next lease
            # waits for a batch to be recorded (which leases at once), a NOTIFY or the poll
            self._next_lease = now + poll
        stale = stale_chains(result, self.flight.failed_keys)
        self.flight.start(lease, stale, self._lease if self._leaser.threaded else None)
        return True

    def _release_leftovers(self, store: OutboxStore) -> bool:
        """After a lease that failed part way, release every lease held but the batches' rows
        (no lease is out now: none is taken from the leaser); False while the database is down."""
        if not self._release_owed:
            return True
        try:
            store.release_all(self.relay_id, keep=self.flight.held())
        except OutboxUnavailable as e:
            self._outage.down(e)
            return False
        self._release_owed = False
        return True

    def _poll(self, store: OutboxStore) -> float:
        """The longest sleep without a wake-up: ``poll``, else 2 s (NOTIFY) or 0.1 s (SQLite)."""
        return self.config.poll or (2.0 if store.dialect == "postgresql" else 0.1)

    def _hold_lock(self, store: OutboxStore) -> bool:
        """SQLite: whether this relay holds the one-relay lock (taking it when free, then
        releasing the leases the last holder left). Always True on PostgreSQL."""
        try:
            if self._lock is None or self._lock.take(store.reset_leases):
                return True
        except OutboxUnavailable as e:  # the lock released again
            self._outage.down(e)
            return False
        self._next_lease = time.monotonic() + self._poll(store)
        return False

    # --- housekeeping ----------------------------------------------------------------------------
    def _housekeeping(self) -> None:
        store, now = self._store, time.monotonic()
        if store is None or self._outage.waiting(now):
            return
        try:
            if (self.flight.batches or self._leaser.pending) and now >= self._next_renew:
                held = self.flight.in_flight() + self._leaser.waiting()
                store.renew(self.relay_id, held, self.config.lease)
                self._next_renew = now + self.config.lease / 3
            if now >= self._next_status:
                self._next_status = now + self.config.status_interval
                store.heartbeat(self.relay_id, self._started)
                self.observer.status(store.status())
                if self.config.keep_sent > 0:
                    store.purge_sent(store.now() - self.config.keep_sent)
        except OutboxUnavailable as e:
            self._outage.down(e)
        self.flight.drop_stuck(now, self.config.publish_timeout)

    # --- the end ---------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.config.drain_timeout
        while self.flight.batches and time.monotonic() < deadline:
            self.flight.take_outcomes()
            self._wake.wait(0.05)
            self._wake.clear()
        self._leaser.close(max(1.0, deadline - time.monotonic()))  # a lease out: waited for
        self.flight.drop_publisher()  # what is still in flight fails now: lost
        self.flight.give_up()
        store = self._store
        while store is not None and self.flight.unrecorded and time.monotonic() < deadline:
            self._outage.ok_at = 0.0
            if not self._record():
                time.sleep(0.2)
        if store is not None:
            try:
                store.release_all(self.relay_id)
                store.forget_relay(self.relay_id)
            except OutboxError as e:
                log.warning("the relay could not release its leases (%s): they expire", describe(e))
            store.close()
        if self._listener is not None:
            self._listener.stop()
        if self._lock is not None:
            self._lock.release()
