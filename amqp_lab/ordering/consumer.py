"""The ordered consumer: per-key order through retries, crashes and takeovers.

It subscribes to every shard queue of an ordered topology
(:func:`amqp_lab.topology.ordered.with_ordered`); each shard has single active consumer on,
so with M workers the broker delivers each shard to exactly one of them and a standby takes it
over when the active one goes. Deliveries run one at a time, the handler in the dedup
transaction (:class:`~amqp_lab.consuming.handling.HandlerRunner`, the same as the plain
consumer's), on a handler thread while this thread keeps the connection pumping.

**Retries keep per-key order.** A broker-held retry (a wait queue) cannot: the failed message
leaves the shard and K's next message runs before it comes back. Here a failing message stays
unacked in the worker, at the head of its key's line (:class:`~amqp_lab.ordering.holds.KeyLines`),
and is run again after a full-jitter backoff; K's later deliveries wait behind it, unacked too,
and only K's: other keys of the shard keep flowing. The head leaves the line when it succeeds
or, after ``retry.max_attempts`` tries (or at once for a business error or poison), is
dead-lettered (a confirmed DLQ record, then basic.ack). Then ``after_dead_letter`` decides:
``continue`` runs K's next message; ``park`` parks K
(:class:`~amqp_lab.ordering.parking.ParkedKeys`, in the dedup store): its later messages go
to the DLQ behind the blocker until a replay of K (``replay.py --key K``) brings the blocker
back.

**Crashes keep order too.** Everything held is unacked: when the worker dies, the broker puts
the deliveries back in the shard in their order (at their original positions, classic and
quorum queues alike) and the new active consumer gets them first. The failure count of a head
is in memory and starts over after a crash; a message that kills workers is stopped by the
store's redelivery count (``max_redeliveries``, poison).

**One engine.** Connections, reconnects, the handler thread, settlement on the delivering
channel, dead-lettering, process spans and the unacked gauge are the engine's
(:mod:`amqp_lab.consuming.engine`), as for the plain consumer; the decision is the same table
(:func:`amqp_lab.consuming.settlement.decide`, retry mode ``hold``). This module schedules: a
line per key.

**The costs.** A held delivery occupies prefetch: a shard whose window fills with one failing
key's backlog stalls until the head is settled (raise ``prefetch``, lower ``retry.cap``). A
held delivery also counts toward the broker's consumer timeout (30 min by default up to 4.2,
quorum queues only on 4.3): ``retry.max_attempts * retry.cap`` must stay well under it.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import drop_connection, translate
from amqp_lab.consuming.config import Handler
from amqp_lab.consuming.dead_letter import RECORD_CLASS, StaleDelivery
from amqp_lab.consuming.delivery import Delivery, DeliveryReport, prepare
from amqp_lab.consuming.engine import ConsumerEngine, OnEngine, stale_as_lost
from amqp_lab.consuming.handler_contract import check_handler
from amqp_lab.consuming.handling import HandlerRunner
from amqp_lab.consuming.lifecycle import State
from amqp_lab.consuming.observer import NO_OBSERVER, ConsumerObserver
from amqp_lab.consuming.settlement import Action, Outcome, Settlement, classify, decide
from amqp_lab.dedup import DedupStore
from amqp_lab.errors import ConnectionLost, ConsumerCancelled, KeyParked
from amqp_lab.observability.guard import guarded
from amqp_lab.observability.tracing import context_of, end_process_span
from amqp_lab.ordering.config import OrderedConfig, key_of, parked_scope
from amqp_lab.ordering.holds import KeyLines
from amqp_lab.ordering.parking import ParkedKeys
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology.retry_check import RetryExpectations

__all__ = ["OrderedConfig", "OrderedConsumer", "key_of", "parked_scope"]  # config: re-exported

log = logging.getLogger(__name__)


class OrderedConsumer(OnEngine):
    """Consumes every shard queue of ``config.names`` until idle_exit, max_messages or
    :meth:`stop`. ``on_report`` gets one :class:`DeliveryReport` per settlement and per
    held retry (outcome ``retried``, with its wait); ``monotonic`` times the retries."""

    def __init__(
        self,
        settings: BrokerSettings,
        handler: Handler,
        store: DedupStore,
        config: OrderedConfig,
        on_report: Callable[[DeliveryReport], None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        uniform: Callable[[float, float], float] = random.uniform,
        observer: ConsumerObserver = NO_OBSERVER,
    ) -> None:
        self.settings, self.store, self.config = settings, store, config
        self.on_report = on_report or (lambda r: log.info(r.line()))
        self.observer = observer = guarded(observer)
        self.clock, self.monotonic, self.uniform = clock, monotonic, uniform
        names = config.names
        self.engine = ConsumerEngine(
            settings,
            store,
            config.engine_config(
                names.dead_letter_exchange,
                RetryExpectations(settings.vhost, names.shard_queues[0], (), "", None, names.dlq),
            ),
            observer,
            clock=clock,
            uniform=uniform,
            end_connection=drop_connection,  # held deliveries go back in order (its docstring)
        )
        self.handled = 0
        self._cancelled = False
        self._runner = HandlerRunner(
            check_handler(handler),
            store,
            config.consumer_config(),
            self.engine.store_retry,
            observer=observer,
            count_failures=False,  # retries are the worker's own (held, in memory)
        )
        self._parked = (
            ParkedKeys(store, parked_scope(settings.vhost, names))
            if config.after_dead_letter == "park"
            else None
        )
        self._lines: KeyLines[tuple[Any, Delivery]] = KeyLines()
        self._inbox: deque[tuple[Any, Delivery]] = deque()
        self._consumers: dict[str, str] = {}  # consumer tag -> shard queue

    def stop(self, reason: str = "stop requested") -> None:
        """Return after the delivery running now (thread- and signal-safe); what is held goes
        back to the shards, in order, when the connection ends."""
        self.engine.stop(reason)

    def run(self) -> int:
        """Consume until finished; returns the number of deliveries settled. Recoverable ends
        (a lost connection, a broker cancel) reconnect with backoff; ``reconnect_attempts``
        connections in a row that settled nothing raise BrokerConnectionError. Fatal ends
        raise: QueueNotFound (a shard missing), AuthenticationFailed, VhostAccessDenied,
        AccessRefused, RetryTopologyError (the DLQ can drop records), DedupStoreError,
        DeadLetterFailed (the DLQ would not take a record: everything held goes back to the
        shards)."""
        self.engine.run(self._session)
        return self.handled

    # --- one connection ---------------------------------------------------------------------
    def _session(self, connection: Any) -> None:
        self._end_spans(d for _, d in self._inbox)
        self._end_spans(d for _, d in self._held())
        self._lines.clear()  # the old connection's deliveries are back in the shards
        self._inbox.clear()
        self._cancelled = False
        channel = self.engine.open_channel(connection, self.config.prefetch)
        try:
            channel.add_on_cancel_callback(lambda _frame: self._note_cancel())
            self.engine.guard.check(connection.sleep, lambda: self.engine.stopping)
            if self.engine.stopping:
                return  # a stop was asked for while the check waited: nothing consumed yet
            self._consumers = {
                channel.basic_consume(shard, self._arrive, auto_ack=False): shard
                for shard in self.config.names.shard_queues
            }
        except (pe.AMQPError, OSError) as e:
            raise translate(e, self.settings) from e
        self.engine.state = State.CONSUMING
        try:
            self._loop(connection, channel)
        except StaleDelivery as e:  # the channel closed: nothing written, all redelivered
            raise stale_as_lost(e) from e
        except (pe.AMQPError, OSError) as e:
            raise translate(e, self.settings) from e

    def _note_cancel(self) -> None:
        self._cancelled = True

    def _arrive(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        """pika callback (this thread, while pumping): decode, start the process span, and
        queue for the loop."""
        d = prepare(method, properties, body, self.clock(), self.config.max_body_bytes)
        d.start_span(self._queue_of(d))
        self._inbox.append((channel, d))

    def _held(self) -> list[tuple[Any, Delivery]]:
        held: list[tuple[Any, Delivery]] = []
        for key in list(self._lines.keys()):
            held.extend(self._lines.take_all(key))
        return held

    def _end_spans(self, deliveries: Iterable[Delivery]) -> None:
        """Deliveries of a connection that ended unsettled: redelivered, their spans ended."""
        for d in deliveries:
            if d.span is not None:
                end_process_span(d.span, "not-settled", d.error)
                d.span = None

    def _loop(self, connection: Any, channel: Any) -> None:
        runnable: deque[str] = deque()
        last_activity = self.monotonic()
        while not self.engine.stopping:
            self._check_channel(channel)
            while self._inbox:
                item = self._inbox.popleft()
                last_activity = self.monotonic()
                key = key_of(item[1])
                if self._parked_out(connection, item, key):
                    continue
                if self._lines.arrive(key, item):
                    runnable.append(key)
            runnable.extend(self._lines.due(self.monotonic()))
            while runnable and not self.engine.stopping:
                self._check_channel(channel)
                self._run_head(connection, runnable.popleft(), runnable)
            self.observer.unacked(len(self._lines) + len(self._inbox))
            if self._finished(last_activity):
                return
            wait = 0.25
            next_due = self._lines.next_due()
            if next_due is not None:
                wait = max(0.0, min(wait, next_due - self.monotonic()))
            connection.process_data_events(time_limit=wait)

    def _check_channel(self, channel: Any) -> None:
        """Raise (recoverable: reconnect) once the broker cancelled a shard consumer - on 4.3
        a quorum queue's consumer timeout takes the deliveries back and ignores late acks - or
        closed the channel (a consumer timeout up to 4.2: 406): what this worker holds is
        back in the shards, and running it here would run it beside the next consumer."""
        if self._cancelled:
            raise ConsumerCancelled(
                "the broker cancelled a shard consumer (a consumer timeout, its queue deleted, "
                "or its node gone); resubscribing"
            )
        if not channel.is_open:
            raise ConnectionLost(
                "the broker closed the consuming channel (a consumer timeout?); the held "
                "deliveries are back in the shards; reconnecting"
            )

    def _finished(self, last_activity: float) -> bool:
        limit, idle = self.config.max_messages, self.config.idle_exit
        if limit is not None and self.handled >= limit:
            return True
        quiet = not self._inbox and not len(self._lines)
        return idle is not None and quiet and self.monotonic() - last_activity >= idle

    def _run_head(self, connection: Any, key: str, runnable: deque[str]) -> None:
        """Run ``key``'s head and settle it as the decision table says: ack, hold (run again
        after a wait; the key waits, the others go on), or dead-letter; queue the key again
        when a next one may run."""
        channel, d = self._lines.head(key)
        failures = self._lines.failures(key)
        if failures:  # a decode error stays: such a delivery never reaches this point again
            d.error, d.duplicate, d.handler_seconds = None, False, None
            if d.task is not None:  # the handler sees which try this is
                d.task = dataclasses.replace(d.task, attempt=d.attempt + failures)
        self._process(connection, d, retry=failures > 0)
        settlement = decide(classify(d.error), failures + 1, self.config.retry)
        if settlement.action is Action.ACK:
            self._settle(channel, d, lambda: channel.basic_ack(d.delivery_tag))
            self._report(d, d.report("duplicate" if d.duplicate else "processed", failures + 1))
        elif settlement.action is Action.HOLD:
            wait = self.config.retry.backoff.wait(failures, self.uniform)
            self._lines.fail(key, self.monotonic() + wait)
            self._report(d, d.report("retried", failures + 1, wait), final=False)
            return  # the key waits; the others go on
        else:
            self._dead_letter_head(connection, channel, key, d, settlement)
            if self._parked is not None and d.message_id is not None:
                return  # the key is parked: its later deliveries went to the DLQ behind it
        if self._lines.done(key) is not None:
            runnable.append(key)

    def _dead_letter_head(
        self, connection: Any, channel: Any, key: str, d: Delivery, settlement: Settlement
    ) -> None:
        """Dead-letter a key's head; with ``park``, park the key first (a crash between the
        DLQ record and the park would let the next worker run K's later messages; a blocker
        that comes back releases K) and send its later deliveries to the DLQ behind it."""
        blocker = d.message_id
        if self._parked is not None and blocker is not None:
            now = self.clock()
            self.engine.store_retry.call(lambda: self._parked_keys().park(key, blocker, now))
        self._dead_letter(connection, channel, d, settlement)
        if self._parked is not None and blocker is not None:
            for later_channel, later in self._lines.take_all(key)[1:]:
                self._park_out(connection, later_channel, later, blocker)

    def _process(self, connection: Any, d: Delivery, retry: bool) -> None:
        """The handler (in the dedup transaction) on the handler thread, pumping I/O meanwhile;
        a connection lost meanwhile waits for the handler, then raises StaleDelivery. A retry
        counts no redelivery (the poison count is for the broker's redeliveries)."""
        run = self._runner.run_again if retry else lambda d: self._runner.process([d])
        future = self.engine.submit(connection, lambda: run(d))
        self.engine.pump_until_done(connection, [future])
        future.result()  # DedupStoreError: the store failed, nothing is settled

    def _parked_out(self, connection: Any, item: tuple[Any, Delivery], key: str) -> bool:
        """A delivery of a parked key goes to the DLQ behind its blocker (True) - unless it is
        the blocker itself, back from a replay: that releases the key (False: it runs)."""
        if self._parked is None or key in self._lines:
            return False
        blocker = self.engine.store_retry.call(lambda: self._parked_keys().blocker(key))
        if blocker is None:
            return False
        channel, d = item
        if d.message_id == blocker:
            self.engine.store_retry.call(lambda: self._parked_keys().release(key))
            log.info("key %r released: its blocker message_id=%s is back", key, blocker)
            return False
        self._park_out(connection, channel, d, blocker)
        return True

    def _park_out(self, connection: Any, channel: Any, d: Delivery, blocker: str) -> None:
        d.error = KeyParked(f"key {key_of(d)!r} is parked behind message_id={blocker}")
        settlement = Settlement(Action.DEAD_LETTER, 0, Outcome.BUSINESS)
        self._dead_letter(connection, channel, d, settlement)

    def _dead_letter(
        self, connection: Any, channel: Any, d: Delivery, settlement: Settlement
    ) -> None:
        """The engine's confirmed DLQ record, then basic.ack; DeadLetterFailed (fatal:
        everything held returns to the shards) when the DLQ would not take it."""
        self.engine.dead_letter(
            connection, channel, d, settlement, self._queue_of(d), context_of(d.span)
        )
        self.handled += 1
        kind = RECORD_CLASS.get(settlement.classification, "unknown")
        self._report(d, d.report("dead-lettered", settlement.attempts, classification=kind))

    def _parked_keys(self) -> ParkedKeys:
        assert self._parked is not None
        return self._parked

    def _queue_of(self, d: Delivery) -> str:
        """The shard queue that delivered ``d`` (by its consumer tag)."""
        return self._consumers.get(str(getattr(d.method, "consumer_tag", "")), "?")

    def _settle(self, channel: Any, d: Delivery, settle: Callable[[], None]) -> None:
        """Settle on the delivering channel only (never on a later one: 406 unknown tag)."""
        self.engine.settle(channel, settle, d)
        self.handled += 1

    def _report(self, d: Delivery, report: DeliveryReport, final: bool = True) -> None:
        """Tell the observer and ``on_report``; a final report ends the delivery's span."""
        self.observer.settled(report)
        if final and d.span is not None:
            end_process_span(d.span, report.outcome, d.error)
            d.span = None
        self.on_report(report)
