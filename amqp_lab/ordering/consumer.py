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

**The costs.** A held delivery occupies prefetch: a shard whose window fills with one failing
key's backlog stalls until the head is settled (raise ``prefetch``, lower ``retry.cap``). A
held delivery also counts toward the broker's consumer timeout (30 min by default up to 4.2,
quorum queues only on 4.3): ``retry.max_attempts * retry.cap`` must stay well under it.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import pika.exceptions as pe

from amqp_lab.connection import BlockedTime, connect, drop_connection, translate
from amqp_lab.consuming.config import ConsumerConfig, Handler
from amqp_lab.consuming.dead_letter import (
    RECORD_CLASS,
    ConfirmedWriter,
    StaleDelivery,
    dlq_message,
)
from amqp_lab.consuming.delivery import Delivery, DeliveryReport, prepare
from amqp_lab.consuming.handler_contract import check_handler
from amqp_lab.consuming.handling import HandlerRunner
from amqp_lab.consuming.lifecycle import End, ReconnectBudget, State, classify_end
from amqp_lab.consuming.observer import NO_OBSERVER, ConsumerObserver
from amqp_lab.consuming.settlement import Action as SettleAction
from amqp_lab.consuming.settlement import Outcome, Settlement, classify
from amqp_lab.consuming.store_retry import StoreRetry
from amqp_lab.consuming.topology_guard import TopologyGuard
from amqp_lab.dedup import DedupStore
from amqp_lab.dedup.identity import bind_vhost
from amqp_lab.dlq.record import utc_iso
from amqp_lab.errors import (
    BrokerConnectionError,
    ConfigurationError,
    ConnectionLost,
    ConsumerCancelled,
    DedupStoreError,
    KeyParked,
    PoisonMessage,
)
from amqp_lab.message import DEFAULT_MAX_BODY_BYTES, FIRST_SEEN_HEADER, OutgoingMessage
from amqp_lab.observability.guard import guarded
from amqp_lab.observability.tracing import context_from_headers
from amqp_lab.ordering.holds import KeyLines
from amqp_lab.ordering.parking import ParkedKeys
from amqp_lab.retry.policy import RetryPolicy, full_jitter
from amqp_lab.settings import BrokerSettings
from amqp_lab.state_key import broker_identity
from amqp_lab.topology.model import Names
from amqp_lab.topology.retry_check import RetryExpectations

__all__ = ["OrderedConfig", "OrderedConsumer", "key_of", "parked_scope"]

log = logging.getLogger(__name__)

ORDERED_RETRY = RetryPolicy("backoff", max_attempts=5, base=0.5, cap=10.0)


@dataclass(frozen=True)
class OrderedConfig:
    """``names``: an ordered topology's roles (``shards`` > 0); ``prefetch``: basic.qos
    prefetch_count per shard consumer - held deliveries occupy it; ``retry``: in-worker
    retries (``max_attempts`` tries in all, full-jitter waits of ``base``..``cap`` seconds;
    its mode is ignored); ``after_dead_letter``: ``continue`` or ``park`` (module docstring);
    ``idle_exit`` seconds without a delivery and nothing held before :meth:`run` returns;
    ``max_messages``: return after that many settled; the other bounds as in
    :class:`~amqp_lab.consuming.ConsumerConfig`, ``verify_topology`` checking the DLQ's
    policies at every connection. Raises ConfigurationError for a topology without shards or
    bounds below 1."""

    names: Names
    prefetch: int = 50
    retry: RetryPolicy = ORDERED_RETRY
    after_dead_letter: Literal["continue", "park"] = "continue"
    idle_exit: float | None = None
    max_messages: int | None = None
    max_redeliveries: int = 3
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    dead_letter_attempts: int = 3
    reconnect_attempts: int = 10
    store_outage: float = 60.0
    max_message_size: int | None = None
    verify_topology: bool = True

    def __post_init__(self) -> None:
        if not self.names.shards:
            raise ConfigurationError(
                "the ordered consumer needs the ordered topology (with_ordered, --ordered N)"
            )
        if min(self.prefetch, self.max_redeliveries, self.reconnect_attempts) < 1:
            raise ConfigurationError("prefetch, max_redeliveries and reconnect_attempts >= 1")
        if self.after_dead_letter not in ("continue", "park"):
            raise ConfigurationError(f"after_dead_letter {self.after_dead_letter!r}")

    def consumer_config(self) -> ConsumerConfig:
        """The plain consumer's settings the shared handler and dead-letter code read."""
        return ConsumerConfig(
            self.names,
            prefetch=self.prefetch,
            max_redeliveries=self.max_redeliveries,
            max_body_bytes=self.max_body_bytes,
            dead_letter_attempts=self.dead_letter_attempts,
            store_outage=self.store_outage,
            verify_topology=False,
            max_message_size=self.max_message_size,
        )


def parked_scope(vhost: str, names: Names) -> str:
    """The scope of an ordered topology's parked keys: ``vhost/entry-exchange``. A store
    serves one vhost (:mod:`amqp_lab.dedup.identity`); the vhost stays in the scope so that rows
    written before a store was bound, and ``keys.py parked`` reading any store, stay
    unambiguous."""
    return f"{vhost}/{names.exchange}"


def key_of(d: Delivery) -> str:
    """A delivery's key for its line: its routing key, which is what the consistent-hash
    exchange placed it by (our publisher sets the ``key`` header to the same value). A
    foreign publisher's ``key`` header that says otherwise is ignored here: lining up by it
    could run one key on two shards at once."""
    return str(d.method.routing_key)


class OrderedConsumer:
    """Consumes every shard queue of ``config.names`` until idle_exit, max_messages or
    :meth:`stop`. ``on_report`` gets one :class:`DeliveryReport` per settlement and per
    held retry (outcome ``held``, with its wait); ``monotonic`` times the retries."""

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
        self._blocked = BlockedTime(observer.blocked)
        self.clock, self.monotonic, self.uniform = clock, monotonic, uniform
        self.state = State.STOPPED
        self.handled = 0
        self.connections_opened = 0
        self.stop_reason: str | None = None
        self._stop = threading.Event()
        self._cancelled = False
        self._settled = False
        self._bound = False  # bind_vhost done (at the first connection)
        plain = config.consumer_config()
        self._store = StoreRetry(plain.store_outage)  # the store's outages, retried
        self._runner = HandlerRunner(
            check_handler(handler),
            store,
            plain,
            self._store,
            observer=observer,
            count_failures=False,  # retries are the worker's own (held, in memory)
        )
        self._writer = ConfirmedWriter(
            settings, config.dead_letter_attempts, uniform, config.max_message_size
        )
        names = config.names
        self._guard = TopologyGuard(
            settings,
            RetryExpectations(settings.vhost, names.shard_queues[0], (), "", None, names.dlq),
            config.verify_topology,
        )
        self._parked = (
            ParkedKeys(store, parked_scope(settings.vhost, config.names))
            if config.after_dead_letter == "park"
            else None
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="handler")
        self._lines: KeyLines[tuple[Any, Delivery]] = KeyLines()
        self._inbox: deque[tuple[Any, Delivery]] = deque()
        self._connection: Any = None
        self._consumers: dict[str, str] = {}  # consumer tag -> shard queue

    def stop(self, reason: str = "stop requested") -> None:
        """Return after the delivery running now (thread- and signal-safe); what is held goes
        back to the shards, in order, when the connection closes."""
        self.stop_reason = reason
        self._stop.set()

    def run(self) -> int:
        """Consume until finished; returns the number of deliveries settled. Recoverable ends
        (a lost connection, a broker cancel) reconnect with backoff; ``reconnect_attempts``
        connections in a row that settled nothing raise BrokerConnectionError. Fatal ends
        raise: QueueNotFound (a shard missing), AuthenticationFailed, VhostAccessDenied,
        AccessRefused, DedupStoreError, StoreVhostMismatch (checked once connected: the
        store serves another vhost), DeadLetterFailed (the DLQ would not take a record:
        everything held goes back to the shards)."""
        budget = ReconnectBudget(self.config.reconnect_attempts)
        try:
            while not self._stop.is_set():
                self.state = State.CONNECTING
                self._settled = False
                try:
                    self._session()
                    break
                except Exception as e:
                    if classify_end(e) is not End.RECOVERABLE:
                        raise
                    budget.connection_ended(self._settled)
                    if budget.exhausted:
                        raise BrokerConnectionError(
                            f"gave up after {budget.failures} connections in a row that settled "
                            f"nothing; last: {e}"
                        ) from e
                    wait = full_jitter(budget.failures, 0.2, 5.0, self.uniform)
                    log.warning("%s; reconnecting in %.1f s", e, wait)
                    self._stop.wait(wait)
            return self.handled
        finally:
            self.state = State.STOPPED
            self._executor.shutdown(wait=True)
            drop_connection(self._connection)
            self._blocked.closed()

    # --- one connection ---------------------------------------------------------------------
    def _session(self) -> None:
        drop_connection(self._connection)
        self._lines.clear()  # the old connection's deliveries are back in the shards
        self._inbox.clear()
        self._cancelled = False
        self._blocked.closed()
        self._connection = connection = connect(self.settings)
        if not self._bound:  # connection.open passed: the vhost is real, the store serves it
            identity = broker_identity(self.settings)
            self._store.call(lambda: bind_vhost(self.store, self.settings.vhost, identity))
            self._bound = True
        self.connections_opened += 1
        if self.connections_opened > 1:
            self.observer.reconnected()
        self._blocked.watch(connection)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self.config.prefetch)
            channel.add_on_cancel_callback(lambda _frame: self._note_cancel())
            self._writer.open(connection)
            self._guard.check()
            self._consumers = {
                channel.basic_consume(shard, self._arrive, auto_ack=False): shard
                for shard in self.config.names.shard_queues
            }
        except (pe.AMQPError, OSError) as e:
            raise translate(e, self.settings) from e
        self.state = State.CONSUMING
        try:
            self._loop(connection, channel)
        except (pe.AMQPError, OSError) as e:
            raise translate(e, self.settings) from e

    def _note_cancel(self) -> None:
        self._cancelled = True

    def _arrive(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        """pika callback (this thread, while pumping): decode and queue for the loop."""
        d = prepare(method, properties, body, self.clock(), self.config.max_body_bytes)
        self._inbox.append((channel, d))

    def _loop(self, connection: Any, channel: Any) -> None:
        runnable: deque[str] = deque()
        last_activity = self.monotonic()
        while not self._stop.is_set():
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
            while runnable and not self._stop.is_set():
                self._check_channel(channel)
                self._run_head(connection, runnable.popleft(), runnable)
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
        """Run ``key``'s head and settle it; queue the key again when a next one may run."""
        channel, d = self._lines.head(key)
        failures = self._lines.failures(key)
        retry = failures > 0
        if retry:  # a decode error stays: such a delivery never reaches this point again
            d.error, d.duplicate, d.handler_seconds = None, False, None
            if d.task is not None:  # the handler sees which try this is
                d.task = dataclasses.replace(d.task, attempt=d.attempt + failures)
        self._process(connection, d, retry)
        outcome = classify(d.error)
        if outcome is Outcome.SUCCESS:
            self._settle(channel, d, lambda: channel.basic_ack(d.delivery_tag))
            self._report(d.report("duplicate" if d.duplicate else "processed", self._tries(key)))
        elif outcome in (Outcome.TRANSIENT, Outcome.UNKNOWN) and (
            self._tries(key) < self.config.retry.max_attempts
        ):
            failures = self._lines.failures(key) + 1
            wait = full_jitter(
                failures - 1, self.config.retry.base, self.config.retry.cap, self.uniform
            )
            self._lines.fail(key, self.monotonic() + wait)
            self._report(d.report("held", failures, wait))
            return  # the key waits; the others go on
        else:
            blocker = d.message_id
            if self._parked is not None and blocker is not None:
                # parked first: a crash between the DLQ record and the park would let the
                # next worker run K's later messages; a blocker that comes back releases K
                now = self.clock()
                self._store.call(lambda: self._parked_keys().park(key, blocker, now))
            self._dead_letter(connection, channel, d, outcome, self._tries(key))
            if isinstance(d.error, PoisonMessage) and d.message_id is not None:
                self._forget_redeliveries(d.message_id)
            if self._parked is not None and d.message_id is not None:
                for later_channel, later in self._lines.take_all(key)[1:]:
                    self._park_out(connection, later_channel, later, d.message_id)
                return
        if self._lines.done(key) is not None:
            runnable.append(key)

    def _tries(self, key: str) -> int:
        return self._lines.failures(key) + 1

    def _process(self, connection: Any, d: Delivery, retry: bool) -> None:
        """The handler (in the dedup transaction) on the handler thread, pumping I/O meanwhile;
        a connection lost meanwhile waits for the handler, then raises ConnectionLost. A retry
        counts no redelivery (the poison count is for the broker's redeliveries)."""
        if retry:
            future = self._executor.submit(self._runner.run_again, d)
        else:
            future = self._executor.submit(self._runner.process, [d])
        future.add_done_callback(lambda _: _wake(connection))
        while not future.done():
            try:
                connection.process_data_events(time_limit=0.1)
            except Exception as e:
                future.exception()
                raise ConnectionLost(f"connection lost while the handler ran: {e}") from e
        future.result()  # DedupStoreError: the store failed, nothing is settled

    def _parked_out(self, connection: Any, item: tuple[Any, Delivery], key: str) -> bool:
        """A delivery of a parked key goes to the DLQ behind its blocker (True) - unless it is
        the blocker itself, back from a replay: that releases the key (False: it runs)."""
        if self._parked is None or key in self._lines:
            return False
        blocker = self._store.call(lambda: self._parked_keys().blocker(key))
        if blocker is None:
            return False
        channel, d = item
        if d.message_id == blocker:
            self._store.call(lambda: self._parked_keys().release(key))
            log.info("key %r released: its blocker message_id=%s is back", key, blocker)
            return False
        self._park_out(connection, channel, d, blocker)
        return True

    def _park_out(self, connection: Any, channel: Any, d: Delivery, blocker: str) -> None:
        d.error = KeyParked(f"key {key_of(d)!r} is parked behind message_id={blocker}")
        self._dead_letter(connection, channel, d, Outcome.BUSINESS, 0)

    def _dead_letter(
        self, connection: Any, channel: Any, d: Delivery, outcome: Outcome, attempts: int
    ) -> None:
        """A confirmed DLQ record through the DLX, then basic.ack; DeadLetterFailed (fatal:
        everything held returns to the shards) when the DLQ would not take it."""
        first_seen = d.headers.get(FIRST_SEEN_HEADER)
        first_seen_at = (
            first_seen if isinstance(first_seen, str) else utc_iso(d.first_seen_at or d.now)
        )
        settlement = Settlement(SettleAction.DEAD_LETTER, attempts, outcome)
        failed_at = self.clock()

        def build(limit: int | None) -> OutgoingMessage:
            return dlq_message(
                d,
                settlement,
                first_seen_at=first_seen_at,
                queue=self._queue_of(d),
                dlx=self.config.names.dead_letter_exchange,
                failed_at=failed_at,
                max_message_size=limit,
            )

        try:
            self._writer.write_record(
                connection,
                channel,
                build,
                f"DLQ record for message_id={d.message_id}",
                context_from_headers(d.headers),  # the dead-letter joins the message's trace
            )
        except StaleDelivery as e:  # the channel closed: nothing written, all redelivered
            raise ConnectionLost(str(e)) from e
        self._settle(channel, d, lambda: channel.basic_ack(d.delivery_tag))
        self._report(d.report("dead-lettered", attempts, classification=RECORD_CLASS[outcome]))

    def _parked_keys(self) -> ParkedKeys:
        assert self._parked is not None
        return self._parked

    def _forget_redeliveries(self, message_id: str) -> None:
        """After a poison message reached the DLQ its redelivery count starts over, so a
        replay gets the full budget (as in the plain consumer); best effort."""
        try:
            self.store.reset_redeliveries(message_id)
        except DedupStoreError as e:
            log.warning("redelivery count of message_id=%s not reset: %s", message_id, e)

    def _queue_of(self, d: Delivery) -> str:
        """The shard queue that delivered ``d`` (by its consumer tag)."""
        return self._consumers.get(str(getattr(d.method, "consumer_tag", "")), "?")

    def _settle(self, channel: Any, d: Delivery, settle: Callable[[], None]) -> None:
        """Settle on the delivering channel only (never on a later one: 406 unknown tag)."""
        if not channel.is_open:
            raise ConnectionLost(
                f"message_id={d.message_id}: channel closed before settlement; redelivered"
            )
        settle()
        self.handled += 1
        self._settled = True

    def _report(self, report: DeliveryReport) -> None:
        self.observer.settled(report)
        self.on_report(report)


def _wake(connection: Any) -> None:
    """Wake process_data_events from the handler thread (the connection may be closed)."""
    try:
        connection.add_callback_threadsafe(lambda: None)
    except Exception:  # closed: nobody waits for the wake-up then
        return
