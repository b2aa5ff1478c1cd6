"""Manual-ack consumer: basic.qos prefetch, the handler, then settlement, in that order.

For each delivery: decode (a bad delivery is a business error, never the worker's end),
de-duplicate by message_id and run the handler in one store transaction, commit, then decide
(:mod:`amqp_lab.consuming.settlement`) and settle: basic.ack, basic.reject(requeue=True), a
confirmed retry copy into a wait queue, or dead-letter: a DLQ record published through the DLX
with confirms + mandatory, the original acked only after the confirm (classic queue
dead-lettering is at-most-once: https://www.rabbitmq.com/docs/dlx#safety), or - ``reject``
mode - basic.reject(requeue=False), so the queue's policy DLX moves it and adds x-death.

This module is the plain consumer's scheduler: batches of ``ack_batch`` deliveries, up to
``concurrency`` of them at once, in delivery order; connections, reconnects, handler threads,
settlement on the delivering channel and dead-lettering are the engine's
(:mod:`amqp_lab.consuming.engine`), shared with the ordered consumer. Every way a consume ends
is recoverable, fatal or finished (:mod:`amqp_lab.consuming.lifecycle`, docs/failure-model.md).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import translate
from amqp_lab.consuming.config import ConsumerConfig, Handler
from amqp_lab.consuming.dead_letter import StaleDelivery
from amqp_lab.consuming.delivery import Delivery, DeliveryReport
from amqp_lab.consuming.engine import ConsumerEngine, OnEngine, stale_as_lost
from amqp_lab.consuming.handler_contract import check_handler
from amqp_lab.consuming.handler_watch import HandlerWatch
from amqp_lab.consuming.handling import HandlerRunner
from amqp_lab.consuming.lifecycle import State
from amqp_lab.consuming.observer import NO_OBSERVER, ConsumerObserver
from amqp_lab.consuming.queue_watch import ChannelWatch, await_queue
from amqp_lab.consuming.settling import Settler, cancel_handing_back, hand_back
from amqp_lab.consuming.units import (
    InFlight,
    decode_batch,
    end_unsettled_spans,
    start_now,
    start_spans,
)
from amqp_lab.dedup import DedupStore
from amqp_lab.errors import ConsumerCancelled, DedupStoreError
from amqp_lab.observability.guard import guarded
from amqp_lab.settings import BrokerSettings

__all__ = ["Consumer", "ConsumerConfig", "DeliveryReport", "Handler"]

log = logging.getLogger(__name__)


class Consumer(OnEngine):
    """Consumes ``config.queue`` until idle_exit, max_messages, or :meth:`stop`; ``state`` is
    its :class:`~amqp_lab.lifecycle.State`. ``on_report`` gets every delivery's report;
    ``observer`` (e.g. :class:`amqp_lab.exporters.metrics.ConsumerMetrics`) the events an
    operator counts. Each delivery gets an OpenTelemetry ``process`` span in the trace its
    ``traceparent`` header carries (:mod:`amqp_lab.observability.tracing`; a no-op without an
    SDK)."""

    def __init__(
        self,
        settings: BrokerSettings,
        handler: Handler,
        store: DedupStore,
        config: ConsumerConfig,
        on_report: Callable[[DeliveryReport], None] | None = None,
        clock: Callable[[], float] = time.time,
        uniform: Callable[[float, float], float] = random.uniform,
        observer: ConsumerObserver = NO_OBSERVER,
    ) -> None:
        self.settings = settings
        self.observer = observer = guarded(observer)
        self.handler = check_handler(handler)
        self.store = store
        self.config = config
        self.on_report = on_report or (lambda r: log.info(r.line()))
        self.clock = clock
        self.uniform = uniform
        self.engine = ConsumerEngine(
            settings,
            store,
            config.engine_config(
                config.names.dead_letter_exchange,
                config.retry_expectations(settings.vhost),
                config.concurrency,
            ),
            observer,
            clock=clock,
            uniform=uniform,
        )
        self._in_flight = 0  # deliveries of the batch whose commit is under way
        self._consumed = False  # the queue existed once: missing later means deleted
        self._units: list[InFlight] = []  # the current connection's units in flight
        self._channel = ChannelWatch(config.queue)  # the broker's cancel or close, heard
        self.watch = HandlerWatch(config.handler_warn_after, config.queue)
        self._runner = HandlerRunner(
            self.handler, store, config, self.engine.store_retry, self.watch, observer
        )
        self._settler = Settler(config, self.engine, uniform, observer)

    @property
    def handled(self) -> int:
        """Deliveries handled so far (settled, or reported as parked)."""
        return self._settler.handled

    @property
    def parked(self) -> int:
        """Deliveries parked so far: the DLQ would not take them (left unacked)."""
        return self._settler.parked

    def stop(self, reason: str = "stop requested") -> None:
        """Drain and return (thread- and signal-safe): stop consuming (basic.cancel), let the
        handlers in flight finish, commit, ack what was committed; deliveries prefetched but
        not started go back to the queue."""
        self.engine.stop(reason)

    def run(self) -> int:
        """Consume until finished; return the number of deliveries handled. Call it once: a
        consumer that returned has shut its handler threads down.

        Recoverable ends (see :func:`~amqp_lab.consuming.lifecycle.classify_end`) reconnect
        with capped full-jitter backoff; after ``reconnect_attempts`` connections in a row that
        settled nothing, BrokerConnectionError. Fatal ends raise: QueueNotFound,
        VhostAccessDenied, AuthenticationFailed, AccessRefused, RetryTopologyError,
        DedupStoreError (the store failed, or stayed unavailable past ``store_outage``),
        StoreVhostMismatch (checked once connected: the store serves another vhost,
        :func:`~amqp_lab.dedup.identity.bind_vhost`), DeadLetterFailed (deliveries the DLQ
        would not take were parked and are back in the queue)."""
        self.engine.run(self._session)
        self._settler.end_of_run()
        return self.handled

    # --- one connection ---------------------------------------------------------------------
    def _session(self, connection: Any) -> None:
        """One connection's consume: a channel, the queue waited for, the topology checked,
        basic.consume, the delivery loop. Raises ConsumerCancelled (recoverable) when the
        broker cancelled the consumer, ConnectionLost for a delivery whose channel closed."""
        self._in_flight = 0  # what was in flight on the old connection will be redelivered
        self._settler.new_connection()  # its parked deliveries are back in the queue
        channel = self.engine.open_channel(connection, self.config.prefetch)
        self._channel.watch(channel)
        bound = self.config.resubscribe_wait if self._consumed else self.config.queue_wait
        try:
            if not await_queue(
                connection,
                self.config.queue,
                self.settings.vhost,
                bound=bound,
                consumed=self._consumed,
                stopping=lambda: self.engine.stopping,
            ):
                return  # a stop was asked for while waiting: nothing was in flight
            self.engine.guard.check(connection.sleep, lambda: self.engine.stopping)
            if self.engine.stopping:
                return  # a stop was asked for while the check waited: nothing consumed yet
            # a batch waits at most ack_interval for more deliveries; with concurrent handlers
            # a finished one is settled within 50 ms even when no delivery arrives
            if self.config.ack_batch > 1:
                tick = self.config.ack_interval
            else:
                tick = 0.25 if self.config.concurrency == 1 else 0.05
            consuming = channel.consume(self.config.queue, inactivity_timeout=tick)
        except (pe.AMQPError, OSError) as e:
            raise translate(e, self.settings) from e
        self.engine.state = State.CONSUMING
        self._consumed = True
        try:
            ended_by_us = self._consume(connection, channel, consuming)
        except BaseException as e:
            # handlers still running on this connection finish first (their commits stand or
            # roll back; none can be acked now): a reconnect must not queue new units behind
            # them, and a store failure in one of them decides how this ends
            failed = self._outlive_units()
            if failed is not None and failed is not e:
                raise failed from e
            if isinstance(e, StaleDelivery):
                raise stale_as_lost(e, self._channel.closed) from e
            if isinstance(e, pe.AMQPError | OSError):
                raise translate(e, self.settings) from e
            raise
        if not ended_by_us:
            raise ConsumerCancelled(
                f"the broker cancelled the consumer of queue {self.config.queue!r} in vhost "
                f"{self.settings.vhost!r} (a consumer timeout on a quorum queue, RabbitMQ 4.3+; "
                "the queue deleted; or its node gone)"
            )

    def _consume(self, connection: Any, channel: Any, consuming: Any) -> bool:
        """The delivery loop; True when it ended on its own terms (stop, idle, max-messages),
        False when the broker cancelled the consumer (the generator just ends).

        Deliveries go to the handler threads in units of ``ack_batch``, at most
        ``concurrency`` units at once; a unit is settled on this thread once its commit is
        done. With one unit at a time the next one is decoded while the previous commits."""
        pending: list[tuple[Any, Any, bytes]] = []
        units: list[InFlight] = []  # submitted, not settled yet
        self._units = units
        last_activity = batch_started = time.monotonic()
        batch_size = self._batch_size()
        ack_interval = self.config.ack_interval
        for method, properties, body in consuming:
            now = time.monotonic()
            if method is not None:
                if not pending:
                    batch_started = now
                    batch_size = self._batch_size()
                pending.append((method, properties, body))
                last_activity = now
                if (
                    len(pending) < batch_size
                    and now - batch_started < ack_interval
                    and not start_now(channel, units)
                ):
                    continue  # the hot path: collecting a batch (stop() is seen at its end)
            self.watch.check()  # once per batch or inactivity tick, not per delivery
            self._note_unacked(channel, len(pending))
            if self.engine.stopping:
                break
            if pending:  # full, due, nothing more to batch, or an inactivity tick: start it
                self._start(connection, channel, units, pending)
                pending = []
                if self.config.ack_batch == 1 and self.config.concurrency == 1:
                    self._settle_all(connection, channel, units)  # one at a time, at once
            elif method is None and units:
                # nothing more arrived: settle what is done (everything, with one unit)
                self._settle_done(connection, channel, units, block=self.config.concurrency == 1)
            if units and self._in_flight + len(pending) + len(self._settler.parked_tags) >= (
                self.config.prefetch
            ):
                # the broker sends nothing more until something is settled: wait for a handler
                # (pika's consume generator would only look again after its inactivity tick)
                self._settle_done(connection, channel, units, block=True)
            idle = self.config.idle_exit
            if self._done() or (
                method is None and idle is not None and now - last_activity >= idle and not units
            ):
                break
        else:
            self._after_broker_cancel(connection, channel, units, pending)
            return False
        self.engine.state = State.DRAINING
        cancel_handing_back(channel)  # basic.cancel; what pika holds goes back (nack requeue)
        self._settle_all(connection, channel, units)
        for method, _, _ in pending:  # collected, never started: back to the queue
            hand_back(channel, method.delivery_tag)
        return True

    def _after_broker_cancel(
        self, connection: Any, channel: Any, units: list[InFlight], pending: list[Any]
    ) -> None:
        """The broker cancelled the consumer: what was delivered is still ours to settle
        (started unless a stop was asked for: then handed back)."""
        if pending and not self.engine.stopping:
            self._start(connection, channel, units, pending)
        elif pending:
            for method, _, _ in pending:
                hand_back(channel, method.delivery_tag)
        self._settle_all(connection, channel, units)

    def _start(
        self,
        connection: Any,
        channel: Any,
        units: list[InFlight],
        deliveries: list[tuple[Any, Any, bytes]],
    ) -> None:
        """Wait for room among the ``concurrency`` units in flight (settling finished ones
        meanwhile), decode ``deliveries`` into a unit and hand it to a handler thread. A stop
        asked for while waiting starts nothing more: the deliveries go back to the queue
        (basic.nack requeue: :func:`hand_back`), as everything prefetched but not started does on a
        drain.

        A unit holding a redelivered delivery runs alone, with no other unit in flight: if its
        handler kills the process, the broker redelivers only it, and the redelivery count that
        declares a message poison (``max_redeliveries``) grows for the message that killed the
        worker, not for innocent ones that happened to run beside it.

        Deliveries that reach this point after the broker cancelled the consumer do not start
        while the queue still exists (:meth:`ChannelWatch.hand_back_after_cancel`: a 4.3
        quorum queue's consumer timeout has returned them already)."""
        give_back = functools.partial(hand_back, channel)
        if self._channel.hand_back_after_cancel(connection, deliveries, give_back):
            return
        alone = any(method.redelivered for method, _, _ in deliveries)
        room = 1 if alone else self.config.concurrency
        # decoded while the units in flight commit (their fsync releases the GIL); the spans
        # start once the unit starts
        batch = decode_batch(deliveries, self.clock(), self.config.max_body_bytes)
        while len(units) >= room:
            self._settle_done(connection, channel, units, block=True)
            if self.engine.stopping:
                for method, _, _ in deliveries:
                    hand_back(channel, method.delivery_tag)
                return
            # waiting pumps the connection: the broker's basic.cancel may have been read now
            if self._channel.hand_back_after_cancel(connection, deliveries, give_back):
                return
        start_spans(batch, self.config.queue)
        self._in_flight += len(batch)
        self._note_unacked(channel)
        units.append((batch, self._submit(connection, batch)))
        if alone:
            self._settle_all(connection, channel, units)

    def _note_unacked(self, channel: Any, collected: int = 0) -> None:
        """Tell the observer how many deliveries the broker has handed over and this consumer
        has not settled: in handler threads, ``collected`` for a batch, parked, and received
        by pika but not yet taken (the broker counts them all as unacked)."""
        waiting = channel.get_waiting_message_count() if channel.is_open else 0
        parked = len(self._settler.parked_tags)
        self.observer.unacked(self._in_flight + collected + parked + waiting)

    def _settle_done(
        self, connection: Any, channel: Any, units: list[InFlight], block: bool
    ) -> None:
        """Settle the units whose work is done (in submission order first: with one unit at a
        time that keeps acks in order); with ``block``, first wait (pumping I/O) until one is."""
        if block:
            self._wait_any(connection, units)
        for unit in [u for u in units if u[1] is None or u[1].done()]:
            oldest = units[0] is unit  # every earlier delivery on the channel is settled
            units.remove(unit)
            self._finish(connection, channel, unit, oldest)

    def _outlive_units(self) -> BaseException | None:
        """Wait for every unit still in a handler thread (after the loop ended abnormally) and
        forget them; returns the first DedupStoreError one of them raised (None if none)."""
        failed: BaseException | None = None
        for batch, future in self._units:
            if future is not None:
                error = future.exception()  # waits: the handler's transaction ends either way
                if failed is None and isinstance(error, DedupStoreError):
                    failed = error
            end_unsettled_spans(batch)  # never settled here: the broker redelivers them
        self._units = []
        self._in_flight = 0
        return failed

    def _settle_all(self, connection: Any, channel: Any, units: list[InFlight]) -> None:
        while units:
            self._settle_done(connection, channel, units, block=True)

    def _batch_size(self) -> int:
        """Deliveries per batch: ``ack_batch``, but never past ``max_messages``."""
        size = self.config.ack_batch
        if self.config.max_messages is not None:
            size = min(size, max(1, self.config.max_messages - self.handled - self._in_flight))
        return size

    def _done(self) -> bool:
        limit = self.config.max_messages
        return limit is not None and self.handled + self._in_flight >= limit

    # --- deliveries -------------------------------------------------------------------------
    def _submit(self, connection: Any, batch: list[Delivery]) -> Future[None] | None:
        """Start the store work of ``batch`` on a handler thread; None when there is none."""
        if not any(d.task is not None or d.message_id is not None for d in batch):
            return None
        return self.engine.submit(connection, lambda: self._runner.process(batch))

    def _finish(self, connection: Any, channel: Any, in_flight: InFlight, oldest: bool) -> None:
        """Wait for a batch's commit (pumping I/O), settle failures one by one (confirmed writes
        first), then ack the successes - with one basic.ack(multiple=True) for a batch when it
        is the ``oldest`` unit in flight and no parked delivery sits on the channel."""
        batch, future = in_flight
        self._in_flight -= len(batch)
        self._note_unacked(channel)
        reports: list[DeliveryReport | None] = []  # in delivery order; None: not settled
        try:
            if future is not None:
                future.result()  # done: raises what the store raised (nothing is settled then)
            self._settler.settle_batch(connection, channel, batch, reports, oldest)
        finally:  # what was settled is reported, even when a later settlement raised
            for report in reports:
                if report is not None:
                    self.on_report(report)
            end_unsettled_spans(batch)  # the store failed, the channel closed: redelivered

    def _wait_any(self, connection: Any, units: list[InFlight]) -> None:
        """Wait until a unit's handlers are done, pumping I/O so heartbeats keep flowing
        (:meth:`ConsumerEngine.pump_until_done`: StaleDelivery when the connection dies)."""
        futures = [f for _, f in units if f is not None]
        if len(futures) < len(units):
            return  # a unit with no store work is done already
        self.engine.pump_until_done(connection, futures, on_tick=self.watch.check)
