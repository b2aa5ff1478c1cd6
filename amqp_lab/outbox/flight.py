"""A relay's batches in flight: each row handed to the publisher, its outcome, the next row of
its chain, and the finished batches waiting to be recorded.

The publisher's outcome callbacks run on its I/O thread and only queue the outcome (a
callback must not publish: it would wait for window room only that thread frees); the relay's
loop takes them with :meth:`Flight.take_outcomes`, on its own thread, and hands the chain's
next row over from there.
"""

from __future__ import annotations

import collections
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from amqp_lab.errors import (
    AmqpLabError,
    AuthenticationFailed,
    OutboxUnavailable,
    VhostAccessDenied,
)
from amqp_lab.observability.tracing import recording
from amqp_lab.outbox.chains import ChainRun
from amqp_lab.outbox.lease import Lease
from amqp_lab.outbox.observer import RelayConfig, RelayObserver, RelayReport
from amqp_lab.outbox.outcomes import RowResult, Verdict, describe, result_for
from amqp_lab.outbox.row import RowUndecodable, message_of
from amqp_lab.outbox.sealing import sealed
from amqp_lab.outbox.trace import end_relay_span, relay_message
from amqp_lab.publishing.observer import PublisherObserver
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.retry.policy import full_jitter
from amqp_lab.settings import BrokerSettings

__all__ = ["Batch", "Flight"]

log = logging.getLogger("amqp_lab.outbox.relay")


@dataclass
class Batch:
    """One leased batch: its chains' progress (``run``), when it started (monotonic), each
    settled row's result and each row's open ``publish`` span."""

    no: int
    lease: Lease
    run: ChainRun
    started: float
    results: dict[int, RowResult] = field(default_factory=dict)
    spans: dict[int, Span | None] = field(default_factory=dict)
    finished: bool = False

    @property
    def offset(self) -> float:
        """The database's clock minus this host's, at the lease."""
        return self.lease.db_now - self.lease.local_now


class Flight:
    """The batches of one relay in flight. ``wake()`` is called (on the publisher's thread)
    when an outcome arrives; ``observer`` and ``on_report`` get each row's outcome."""

    def __init__(
        self,
        config: RelayConfig,
        observer: RelayObserver,
        on_report: Callable[[RelayReport], None] | None,
        wake: Callable[[], None],
    ) -> None:
        self.config, self.observer, self.on_report, self.wake = config, observer, on_report, wake
        self.publisher: PipelinedPublisher | None = None
        self.batches: dict[int, Batch] = {}
        self.unrecorded: list[Batch] = []
        self.sent = self.refused = self.lost = 0
        self._outcomes: queue.SimpleQueue[tuple[int, int, Any, float]] = queue.SimpleQueue()
        self._numbers = 0
        self._publisher_ok_at = 0.0  # monotonic: the next try to connect
        self._publisher_failures = 0
        self._running: dict[str, int] = {}  # key -> the batch whose chain of it runs now
        self._waiting: dict[str, collections.deque[tuple[int, int]]] = {}  # (batch, first)
        self._tail: dict[str, int] = {}  # key -> the last row leased, while it runs
        self.failed_keys: set[str] = set()  # keys whose chain failed since the relay cleared it

    def tails(self) -> dict[str, int]:
        """Keys whose chain is running, with the last row leased for each: their next rows
        may be leased now, to go once those are confirmed (a continuation)."""
        return {key: self._tail[key] for key in self._running}

    def ensure_publisher(self, settings: BrokerSettings, observer: PublisherObserver) -> bool:
        """A working publisher: the current one, or a new one (window ``config.window``) once
        the backoff after the last failure to connect is over; False meanwhile. Raises
        AuthenticationFailed / VhostAccessDenied: retrying cannot help."""
        publisher = self.publisher
        if publisher is not None and publisher.failure is None:
            return True
        if publisher is not None:
            log.warning("the relay's publisher failed (%s); reconnecting", publisher.failure)
            self.drop_publisher()
        if time.monotonic() < self._publisher_ok_at:
            return False
        try:
            self.publisher = PipelinedPublisher(
                settings, window=self.config.window, observer=observer
            )
        except (AuthenticationFailed, VhostAccessDenied):
            raise
        except AmqpLabError as e:
            self._publisher_failures += 1
            delay = full_jitter(min(self._publisher_failures, 8), 0.5, 10.0)
            self._publisher_ok_at = time.monotonic() + delay
            if self._publisher_failures == 1:
                log.warning("the relay cannot reach the broker (%s); retrying", describe(e))
            return False
        if self._publisher_failures:
            log.warning("the relay reached the broker again")
        self._publisher_failures = 0
        return True

    def drop_publisher(self) -> None:
        """Close the publisher: every publish without an outcome fails now (lost)."""
        publisher, self.publisher = self.publisher, None
        if publisher is not None:
            try:
                publisher.close(flush_timeout=0)
            except Exception as e:  # closing a dead connection must not stop the relay
                log.debug("closing the publisher: %s", e)

    def held(self) -> list[int]:
        """Every row leased and not yet recorded (in flight, or settled and waiting)."""
        return sorted(r for b in (*self.batches.values(), *self.unrecorded) for r in b.lease.rows)

    def held_keys(self) -> list[str]:
        """The keys of the rows :meth:`held`: none of their rows can be a head now."""
        batches = (*self.batches.values(), *self.unrecorded)
        keys = {row.ordering_key for b in batches for row in b.lease.rows.values()}
        return sorted(k for k in keys if k is not None)

    def in_flight(self) -> list[int]:
        """The rows of the batches not finished (their leases are to be renewed)."""
        return [r for b in self.batches.values() for r in b.lease.rows]

    def drop_stuck(self, now: float, timeout: float) -> None:
        """When a batch has been in flight for more than ``timeout`` seconds (monotonic
        ``now``), drop the publisher: what it has not confirmed fails (lost) and goes again."""
        stuck = next((b for b in self.batches.values() if now - b.started > timeout), None)
        if stuck is not None:
            log.warning(
                "a batch of %d rows has waited %.0f s for its confirms: the publisher is "
                "replaced and its rows go again",
                len(stuck.lease.rows),
                now - stuck.started,
            )
            self.drop_publisher()

    def start(
        self,
        lease: Lease,
        drop: set[int] | frozenset[int] = frozenset(),
        then: Callable[[], object] | None = None,
    ) -> None:
        """Hand every chain's first row of ``lease`` to the publisher - but a chain whose key
        is still running in another batch waits until that chain is confirmed to its end,
        and the chains whose first row is in ``drop`` never go (their rows are recorded
        untried: :func:`amqp_lab.outbox.leaser.stale_chains`). ``then`` runs once the batch
        is among :attr:`batches`, before its rows are handed over (the relay submits its
        next lease there: the lease's database time overlaps the hand-over)."""
        self._numbers += 1
        batch = Batch(self._numbers, lease, ChainRun(lease.chains), time.monotonic())
        self.batches[batch.no] = batch
        defer = set(drop)
        for chain in lease.chains:
            key = lease.rows[chain[0]].ordering_key
            if key is None or chain[0] in drop:
                continue
            self._tail[key] = max(self._tail.get(key, 0), chain[-1])
            if key in self._running:
                self._waiting.setdefault(key, collections.deque()).append((batch.no, chain[0]))
                defer.add(chain[0])
            else:
                self._running[key] = batch.no
        if then is not None:
            then()
        self._publish(batch, *batch.run.start(defer))
        for first in drop:
            batch.run.drop(first)
        if batch.run.done:
            self._finish(batch)

    def _chain_ended(self, batch: Batch, row_id: int, sent: bool) -> None:
        """A chain of ``batch`` stopped at ``row_id``: at its end (``sent``: the next chain of
        its key may go) or at a failure (the key's waiting chains are dropped, untried)."""
        key = batch.lease.rows[row_id].ordering_key
        if key is not None and not sent:
            self.failed_keys.add(key)
        if key is None or self._running.get(key) != batch.no:
            return
        del self._running[key]
        waiting = self._waiting.pop(key, collections.deque())
        if sent and waiting:
            batch_no, first = waiting.popleft()
            self._running[key] = batch_no
            if waiting:
                self._waiting[key] = waiting
            resumed = self.batches[batch_no]
            self._publish(resumed, resumed.run.resume(first))
            return
        if not self._running.get(key):
            self._tail.pop(key, None)
        for batch_no, first in waiting:
            later = self.batches.get(batch_no)
            if later is not None:
                later.run.drop(first)
                if later.run.done:
                    self._finish(later)

    def take_outcomes(self) -> bool:
        """Settle the outcomes that arrived; whether there were any."""
        took = False
        while True:
            try:
                batch_no, row_id, error, at = self._outcomes.get_nowait()
            except queue.Empty:
                return took
            took = True
            batch = self.batches.get(batch_no)
            if batch is not None and row_id not in batch.results:
                self._settle(batch, row_id, error, at)

    def give_up(self) -> None:
        """Settle every row still in flight as lost (the publisher is gone), drop the chains
        waiting for them, and finish every batch."""
        self.take_outcomes()
        for key, waiting in list(self._waiting.items()):
            for batch_no, first in waiting:
                if batch_no in self.batches:
                    self.batches[batch_no].run.drop(first)
            del self._waiting[key]
        for batch in list(self.batches.values()):
            settled, untried = set(batch.results), set(batch.run.unattempted())
            for row_id in batch.run.rows():
                if row_id not in settled and row_id not in untried and not batch.finished:
                    self._settle(batch, row_id, OutboxUnavailable("the relay stopped"), time.time())
            self._finish(batch)

    def _on_outcome(self, batch_no: int, row_id: int, error: Any) -> None:
        self._outcomes.put((batch_no, row_id, error, time.time()))
        self.wake()

    def _callback(self, batch_no: int, row_id: int) -> Callable[[Any, Any], None]:
        def outcome(_message: Any, error: Any) -> None:
            self._on_outcome(batch_no, row_id, error)

        return outcome

    def _publish(self, batch: Batch, *row_ids: int) -> None:
        """Hand ``row_ids`` (of ``batch``) to the publisher in one go; a row that is no message,
        or finds no publisher, is settled at once. A plain row goes with the properties
        :func:`~amqp_lab.outbox.sealing.sealed` encodes from its columns, any other (or every
        row, while spans record) as the message :func:`message_of` makes of it."""
        publisher = self.publisher
        failure = OutboxUnavailable("no publisher") if publisher is None else publisher.failure
        plain: list[tuple[Any, Any, Callable[[Any, Any], None]]] = []
        ready: list[tuple[Any, Callable[[Any, Any], None]]] = []
        spans = recording()  # once per hand-over, not per row
        now = int(time.time())
        for row_id in row_ids:
            row = batch.lease.rows[row_id]
            properties = None if spans or failure is not None else sealed(row, now)
            if properties is not None:
                plain.append((row, properties, self._callback(batch.no, row_id)))
                continue
            try:
                message = message_of(row)
            except RowUndecodable as e:
                self._settle(batch, row_id, e, time.time())
                continue
            if publisher is None or failure is not None:
                self._settle(batch, row_id, failure, time.time())
                continue
            message, span = relay_message(message, row.traceparent, row.tracestate, spans)
            batch.spans[row_id] = span
            ready.append((message, self._callback(batch.no, row_id)))
        if publisher is None:
            return
        try:
            if plain:
                publisher.publish_sealed(plain)
            if ready:
                publisher.publish_each(ready)
        except AmqpLabError as e:  # the publisher failed for good meanwhile
            for callback in [c for *_, c in plain] + [c for _, c in ready]:
                callback(None, e)

    def _settle(self, batch: Batch, row_id: int, error: BaseException | None, at: float) -> None:
        row = batch.lease.rows[row_id]
        cfg = self.config
        result = result_for(row_id, error, row.tries, cfg.retry_base, cfg.retry_cap)
        batch.results[row_id] = result
        end_relay_span(batch.spans.pop(row_id, None), error)
        lag = None
        if result.verdict is Verdict.SENT:
            self.sent += 1
            lag = max(0.0, at + batch.offset - row.due)
        elif result.verdict is Verdict.REFUSED:
            self.refused += 1
            log.warning(
                "outbox row message_id=%r key=%r refused (%s): %s",
                row.message_id,
                row.ordering_key,
                "parked" if result.parked else f"next try in {result.wait:.1f} s",
                result.error,
            )
        else:
            self.lost += 1
        self.observer.relayed(row, result.verdict, lag)
        if self.on_report is not None:
            outcome = result.verdict.value
            self.on_report(
                RelayReport(row.message_id, row.ordering_key, outcome, row.tries, result.error, lag)
            )
        sent = result.verdict is Verdict.SENT
        following = batch.run.settle(row_id, sent)
        if following is not None:
            self._publish(batch, following)
        elif not sent or batch.run.last(row_id):
            self._chain_ended(batch, row_id, sent)
        if batch.run.done:
            self._finish(batch)

    def _finish(self, batch: Batch) -> None:
        if batch.finished:
            return
        batch.finished = True
        for row_id in batch.run.unattempted():
            batch.results[row_id] = RowResult(row_id, Verdict.UNATTEMPTED)
        self.batches.pop(batch.no, None)
        self.unrecorded.append(batch)
