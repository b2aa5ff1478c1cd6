"""The one consumer engine: what every amqp-lab consumer does, whatever it schedules.

A consumer is a scheduler - the plain one (:class:`~amqp_lab.consuming.consumer.Consumer`:
batches, units, concurrency) or the ordered one
(:class:`~amqp_lab.ordering.consumer.OrderedConsumer`: per-key lines) - over this engine,
which owns:

* the life of a consumer (:mod:`amqp_lab.consuming.lifecycle`): one connection at a time,
  recoverable ends reconnect with capped full-jitter backoff (:data:`RECONNECT_BACKOFF`) until
  the reconnect budget is spent, fatal ends raise;
* each connection's start: connect, bind the dedup store to the vhost (once), the blocked-time
  watch, the observer told of reconnects, a channel with basic.qos, the confirm-mode writer
  channel, the topology guard (the retry path and the DLQ, every connection);
* the handler threads and pumping I/O while they run (heartbeats flow during a long handler:
  pika #1104);
* settlement on the delivering channel only (bunny #142, aio-pika #98), and dead-lettering: a
  confirmed DLQ record, then basic.ack.

What to run next, and how a delivery's outcome is decided
(:func:`amqp_lab.consuming.settlement.decide`), is the scheduler's.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pika.exceptions as pe
from opentelemetry.context import Context

from amqp_lab import frame_reader
from amqp_lab.connection import BlockedTime, close_quietly, connect, translate
from amqp_lab.consuming.config import EngineConfig
from amqp_lab.consuming.dead_letter import ConfirmedWriter, StaleDelivery, dlq_message
from amqp_lab.consuming.delivery import Delivery
from amqp_lab.consuming.lifecycle import End, ReconnectBudget, State, classify_end
from amqp_lab.consuming.observer import ConsumerObserver
from amqp_lab.consuming.settlement import Settlement
from amqp_lab.consuming.store_retry import StoreRetry
from amqp_lab.consuming.topology_guard import TopologyGuard
from amqp_lab.dedup import DedupStore
from amqp_lab.dedup.identity import bind_vhost
from amqp_lab.errors import BrokerConnectionError, ConnectionLost, DedupStoreError, PoisonMessage
from amqp_lab.retry.policy import Backoff
from amqp_lab.settings import BrokerSettings
from amqp_lab.state_key import broker_identity

__all__ = ["RECONNECT_BACKOFF", "ConsumerEngine", "EngineConfig", "OnEngine"]

log = logging.getLogger(__name__)

RECONNECT_BACKOFF = Backoff(base=0.2, cap=5.0)
"""Between a consumer's connections: 0.2 s doubling, at most 5 s, full jitter."""


class ConsumerEngine:
    """One consumer's connections, handler threads, writer and settlement (module docstring).
    ``observer`` must already be guarded (the consumers guard what they are given);
    ``end_connection`` ends a connection before the next and at the end (a graceful close, or
    :func:`amqp_lab.connection.drop_connection` for the ordered consumer); ``clock``: epoch
    seconds; ``uniform``: the backoffs' jitter."""

    def __init__(
        self,
        settings: BrokerSettings,
        store: DedupStore,
        config: EngineConfig,
        observer: ConsumerObserver,
        *,
        clock: Callable[[], float] = time.time,
        uniform: Callable[[float, float], float] = random.uniform,
        end_connection: Callable[[Any], None] = close_quietly,
    ) -> None:
        self.settings = settings
        self.store = store
        self.config = config
        self.observer = observer
        self.clock = clock
        self.uniform = uniform
        self.state = State.STOPPED
        self.connections_opened = 0
        self.stop_reason: str | None = None
        self.stop_event = threading.Event()
        self.connection: Any = None
        self.settled = False  # the current connection settled a delivery (the budget's reset)
        self.executor = ThreadPoolExecutor(
            max_workers=config.handler_threads, thread_name_prefix="handler"
        )
        self.store_retry = StoreRetry(config.store_outage)
        self.blocked = BlockedTime(observer.blocked)
        self.writer = ConfirmedWriter(
            settings,
            config.dead_letter_attempts,
            uniform,
            config.max_message_size,
            config.confirm_timeout,
            lambda: self.blocked.blocked,
        )
        self.guard = TopologyGuard(settings, config.expectations, config.verify_topology)
        self._end_connection = end_connection
        self._bound = False  # bind_vhost done (at the first connection)

    # --- life -----------------------------------------------------------------------------
    def stop(self, reason: str = "stop requested") -> None:
        """Ask the consumer to stop (thread- and signal-safe); the scheduler drains."""
        self.stop_reason = reason
        self.stop_event.set()

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked for."""
        return self.stop_event.is_set()

    def run(self, session: Callable[[Any], None]) -> None:
        """Call ``session(connection)`` on one new connection after another until it returns
        (finished) or raises a fatal end; recoverable ends reconnect after a
        :data:`RECONNECT_BACKOFF` wait. After ``reconnect_attempts`` connections in a row that
        settled nothing, BrokerConnectionError. Always ends with the handler threads done and
        the connection ended."""
        budget = ReconnectBudget(self.config.reconnect_attempts)
        try:
            while not self.stop_event.is_set():
                self.state = State.CONNECTING
                self.settled = False
                try:
                    session(self._open())
                    return
                except Exception as e:
                    if classify_end(e) is not End.RECOVERABLE:
                        raise
                    budget.connection_ended(self.settled)
                    if budget.exhausted:
                        raise BrokerConnectionError(
                            f"gave up after {budget.failures} connections in a row that settled "
                            f"nothing; last: {e}"
                        ) from e
                    wait = RECONNECT_BACKOFF.wait(budget.failures, self.uniform)
                    log.warning(
                        "%s; reconnecting in %.1f s (%d/%d)", e, wait, budget.failures, budget.limit
                    )
                    self.stop_event.wait(wait)
        finally:
            self.state = State.STOPPED
            self.executor.shutdown(wait=True)
            self._end_connection(self.connection)
            self.blocked.closed()
            self.observer.unacked(0)

    def _open(self) -> Any:
        """End the last connection, open the next: connect, bind the store to the vhost (the
        first time; after connection.open accepted the vhost), watch blocked time."""
        self._end_connection(self.connection)
        self.blocked.closed()
        self.observer.unacked(0)
        self.connection = connection = connect(self.settings)
        frame_reader.install(connection)
        if not self._bound:
            identity = broker_identity(self.settings)
            self.store_retry.call(lambda: bind_vhost(self.store, self.settings.vhost, identity))
            self._bound = True
        self.connections_opened += 1
        if self.connections_opened > 1:
            self.observer.reconnected()
        self.blocked.watch(connection)
        return connection

    def open_channel(self, connection: Any, prefetch: int) -> Any:
        """A consuming channel with basic.qos ``prefetch``, the writer's confirm channel,
        then the topology guard. Raises what :func:`amqp_lab.connection.translate` gives for a
        pika error, RetryTopologyError from the guard."""
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=prefetch)
            self.writer.open(connection)
        except (pe.AMQPError, OSError) as e:
            raise translate(e, self.settings) from e
        return channel

    # --- handler threads --------------------------------------------------------------------
    def submit(self, connection: Any, work: Callable[[], None]) -> Future[None]:
        """Run ``work`` on a handler thread; when it is done, wake the I/O thread's
        ``process_data_events`` (the connection may be closed by then: nobody waits)."""
        future = self.executor.submit(work)
        future.add_done_callback(lambda _: _wake(connection))
        return future

    def pump_until_done(
        self,
        connection: Any,
        futures: list[Future[None]],
        on_tick: Callable[[], object] = lambda: None,
        tick: float = 0.1,
    ) -> None:
        """Pump the connection's I/O (heartbeats, cancels, closes) until one of ``futures`` is
        done, calling ``on_tick`` at least every ``tick`` seconds. If the connection dies
        meanwhile, wait for all of them (their commits stand or roll back) and raise
        StaleDelivery: nothing of theirs can be settled on it."""
        pump_error: BaseException | None = None
        if not futures:
            return  # nothing to wait for (a loop over none would never end)
        while not any(f.done() for f in futures):
            on_tick()
            try:
                connection.process_data_events(time_limit=tick)
            except Exception as e:
                pump_error = e
                break
        if pump_error is not None:
            for future in futures:
                future.exception()  # the handlers' work is committed (or rolled back) by now
            raise StaleDelivery(f"connection lost while the handler ran: {pump_error}")

    # --- settlement -------------------------------------------------------------------------
    def settle(self, channel: Any, settle: Callable[[], None], d: Delivery) -> None:
        """Settle on the delivering channel only; StaleDelivery when it has closed (the
        broker redelivers: a settlement on a later channel would be 406 unknown delivery
        tag)."""
        if not channel.is_open:
            raise StaleDelivery(
                f"message_id={d.message_id}: channel closed before settlement; "
                "the broker will redeliver it"
            )
        settle()
        self.settled = True

    def dead_letter(
        self,
        connection: Any,
        channel: Any,
        d: Delivery,
        settlement: Settlement,
        queue: str,
        parent: Context | None,
    ) -> None:
        """A confirmed DLQ record of ``d`` (JSON, or its raw form when it would be over the
        broker's limit) through the DLX, then basic.ack on the delivering channel; for a poison
        message its redelivery count starts over (a replay gets the full budget). Raises
        DeadLetterFailed (RecordTooLarge included) when the DLQ did not take it, StaleDelivery
        when the channel closed, AccessRefused on a 403."""
        failed_at = self.clock()

        def build(limit: int | None) -> Any:
            return dlq_message(
                d,
                settlement,
                first_seen_at=d.first_seen_iso(),
                queue=queue,
                dlx=self.config.dlx,
                failed_at=failed_at,
                max_message_size=limit,
            )

        what = f"DLQ record for message_id={d.message_id}"
        self.writer.write_record(connection, channel, build, what, parent)
        self.settle(channel, lambda: channel.basic_ack(d.delivery_tag), d)
        if isinstance(d.error, PoisonMessage) and d.message_id is not None:
            self.forget_redeliveries(d.message_id)

    def forget_redeliveries(self, message_id: str) -> None:
        """After a poison message reached the DLQ: its redelivery count starts over. Best
        effort, one try: this runs on the I/O thread, which must not wait out a store
        outage."""
        try:
            self.store.reset_redeliveries(message_id)
        except DedupStoreError as e:
            log.warning("redelivery count of message_id=%s not reset: %s", message_id, e)


class OnEngine:
    """What a consumer built on an engine (``self.engine``) shows of its life."""

    engine: ConsumerEngine

    @property
    def state(self) -> State:
        """Where the consumer is in its life (:class:`~amqp_lab.consuming.lifecycle.State`)."""
        return self.engine.state

    @property
    def connections_opened(self) -> int:
        """Connections opened so far (the first included)."""
        return self.engine.connections_opened

    @property
    def stop_reason(self) -> str | None:
        """Why :meth:`stop` was called (None: it was not)."""
        return self.engine.stop_reason

    @property
    def _connection(self) -> Any:
        return self.engine.connection

    def stop(self, reason: str = "stop requested") -> None:
        """Stop (thread- and signal-safe): the consumer drains and :meth:`run` returns."""
        self.engine.stop(reason)


def stale_as_lost(error: StaleDelivery, why: BaseException | None = None) -> ConnectionLost:
    """A stale delivery ends the connection's work: the recoverable ConnectionLost, naming why
    the broker closed the channel when it said so."""
    text = str(error)
    return ConnectionLost(f"{text} (the broker closed the channel: {why})" if why else text)


def _wake(connection: Any) -> None:
    """Wake process_data_events from a handler thread (the connection may be closed)."""
    try:
        connection.add_callback_threadsafe(lambda: None)
    except Exception:  # closed: nobody waits for the wake-up then
        return
