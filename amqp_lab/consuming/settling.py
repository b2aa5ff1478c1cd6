"""Settlement on the delivering channel, after the unit's commit: basic.ack (one
basic.ack(multiple=True) for a batch when it is safe), basic.reject(requeue=True), a confirmed
retry copy into a wait queue, a confirmed DLQ record (or basic.reject to the DLX), or - when
the DLQ takes nothing - the delivery parked (left unacked until the connection ends).

A delivery tag is only ever settled on the channel that delivered it: if that channel died
meanwhile the settlement is dropped (the broker redelivers; de-duplication keeps one effect)
instead of killing the new channel with 406 unknown delivery tag (bunny #142, aio-pika #98).
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context

from amqp_lab.consuming.config import ConsumerConfig
from amqp_lab.consuming.dead_letter import RECORD_CLASS
from amqp_lab.consuming.delivery import Delivery, DeliveryReport
from amqp_lab.consuming.observer import NO_OBSERVER, ConsumerObserver
from amqp_lab.consuming.settlement import Action, Settlement, classify
from amqp_lab.consuming.settlement import decide as decide_settlement
from amqp_lab.errors import DeadLetterFailed, RecordTooLarge
from amqp_lab.observability.tracing import context_of, end_process_span
from amqp_lab.retry.broker_held import retry_copy, retry_wait

if TYPE_CHECKING:
    from amqp_lab.consuming.engine import ConsumerEngine

__all__ = ["Settler", "cancel_handing_back", "hand_back"]

log = logging.getLogger(__name__)


def hand_back(channel: Any, delivery_tag: int) -> None:
    """Give a delivery that was never started back to the queue: basic.nack(requeue=True).
    Not a failure, so not a reject: from RabbitMQ 4.3 a quorum queue does not count a nack
    toward ``x-delivery-count`` and the delivery limit (before 4.3 it counts every return)."""
    channel.basic_nack(delivery_tag, requeue=True)


def cancel_handing_back(channel: Any) -> None:
    """basic.cancel the consumer of pika's consume generator, handing back (:func:`hand_back`)
    every delivery the consumer never took: those pika holds, and those that arrive between
    the basic.cancel and its cancel-ok. pika's ``cancel()`` alone gives both back with
    basic.reject, which a RabbitMQ 4.3+ quorum queue counts as a failed delivery: every drain
    would bring up to ``prefetch`` innocent messages closer to the delivery limit. So the
    underlying channel's basic.reject is a basic.nack(requeue) for the length of the cancel."""
    generator = getattr(channel, "_queue_consumer_generator", None)
    events = getattr(generator, "pending_events", None)
    if events is not None:  # pika 1.x keeps them in a deque; else pika's cancel() does it
        for _ in range(channel.get_waiting_message_count()):
            hand_back(channel, events.popleft().method.delivery_tag)
    impl = getattr(channel, "_impl", None)
    if impl is None or not hasattr(impl, "basic_nack"):
        channel.cancel()
        return

    def nack_instead(delivery_tag: int, requeue: bool = True) -> None:
        impl.basic_nack(delivery_tag, multiple=False, requeue=requeue)

    impl.basic_reject = nack_instead  # an instance attribute over the method, removed below
    try:
        channel.cancel()
    finally:
        del impl.basic_reject


class Settler:
    """Settles the plain consumer's deliveries through ``engine`` (on the delivering channel,
    DLQ records, the writer) and keeps the counts the consumer's life depends on: ``handled``
    (deliveries settled or reported), ``parked`` (in all) and the parked delivery tags of the
    current channel. ``uniform``: the retry waits' jitter; ``observer`` hears of every settled
    delivery and batch. Each delivery's process span is ended with its outcome once it is
    settled."""

    def __init__(
        self,
        config: ConsumerConfig,
        engine: ConsumerEngine,
        uniform: Callable[[float, float], float] = random.uniform,
        observer: ConsumerObserver = NO_OBSERVER,
    ) -> None:
        self.config = config
        self.engine = engine
        self.observer = observer
        self.uniform = uniform
        self.handled = 0
        self.parked = 0
        self.parked_tags: dict[int, str] = {}  # delivery tag -> why, on the current channel
        self.too_large: set[int] = set()  # of those, the tags whose record fits no form
        self._multiple_ok = True  # no parked delivery on the channel: ack multiple is safe
        self._stuck: DeadLetterFailed | None = None  # raised once the parked one is reported

    def new_connection(self) -> None:
        """Forget the old connection's channel: its parked deliveries are back in the queue."""
        self._multiple_ok = True
        self._stuck = None
        self.parked_tags.clear()
        self.too_large.clear()

    def settle_batch(
        self,
        connection: Any,
        channel: Any,
        batch: list[Delivery],
        reports: list[DeliveryReport | None],
        oldest: bool = False,
    ) -> None:
        """Settle ``batch`` (committed) on ``channel``, appending each delivery's report to
        ``reports`` in delivery order (None for one that was not settled because a later
        settlement raised). ``oldest``: every delivery before the batch on this channel is
        settled (its successes may then be acked with one basic.ack multiple=True, as always
        with one unit at a time). Raises StaleDelivery when the channel closed,
        DeadLetterFailed when as many deliveries as the prefetch are parked."""
        start = len(reports)
        try:
            self._settle_batch(connection, channel, batch, reports, oldest)
        finally:
            for d, report in zip(batch, reports[start:], strict=False):
                if report is not None:
                    self.observer.settled(report)
                    if d.span is not None:
                        end_process_span(d.span, report.outcome, d.error)
                        d.span = None
            self.observer.batch_settled(len(batch))

    def _settle_batch(
        self,
        connection: Any,
        channel: Any,
        batch: list[Delivery],
        reports: list[DeliveryReport | None],
        oldest: bool,
    ) -> None:
        successes: list[tuple[int, DeliveryReport]] = []  # (position in reports, its report)
        last: Delivery | None = None
        for d in batch:
            settlement = decide_settlement(classify(d.error), d.attempt, self.config.retry)
            self.handled += 1
            if settlement.action is Action.ACK:
                outcome = "duplicate" if d.duplicate else "processed"
                successes.append((len(reports), d.report(outcome, settlement.attempts)))
                reports.append(None)  # reported once acked
                last = d
                continue
            reports.append(self._settle_failure(connection, channel, d, settlement))
            if self._stuck is not None:  # reported above as parked; now the consumer stops
                stuck, self._stuck = self._stuck, None
                raise stuck
        if last is None:
            return
        if len(batch) > 1 and self._multiple_ok and (oldest or self.config.concurrency == 1):
            # every delivery up to the last success is a success or already settled above
            ack_all = functools.partial(channel.basic_ack, last.delivery_tag, multiple=True)
            self.settle(channel, ack_all, last)
        else:
            for d in batch:
                if d.error is None:  # the successes (processed or duplicate)
                    self.settle(channel, functools.partial(channel.basic_ack, d.delivery_tag), d)
        for position, report in successes:
            reports[position] = report

    def _settle_failure(
        self, connection: Any, channel: Any, d: Delivery, settlement: Settlement
    ) -> DeliveryReport:
        tag = d.delivery_tag
        kind = RECORD_CLASS.get(settlement.classification, "unknown")
        parent = context_of(d.span)  # the retry copy / DLQ record continue the delivery's trace
        if settlement.action is Action.REQUEUE:
            # basic.reject, not basic.nack: a failure, which RabbitMQ 4.3+ quorum queues count
            # toward x-delivery-count and the delivery limit (a hand-back is a nack: not)
            self.settle(channel, lambda: channel.basic_reject(tag, requeue=True), d)
            return d.report("requeued", settlement.attempts, classification=kind)
        if settlement.action is Action.RETRY_LATER:
            report = self._retry_later(connection, channel, d, settlement, kind, parent)
            if report is not None:
                return report
        if self.config.dead_letter == "reject":
            self.settle(channel, lambda: channel.basic_reject(tag, requeue=False), d)
            return d.report("dead-lettered", settlement.attempts, classification=kind)
        try:
            self.engine.dead_letter(connection, channel, d, settlement, self.config.queue, parent)
        except DeadLetterFailed as e:  # RecordTooLarge too: the message stays where it is
            self._park(d, e)
            return d.report("parked", settlement.attempts, classification=kind)
        return d.report("dead-lettered", settlement.attempts, classification=kind)

    def _retry_later(
        self,
        connection: Any,
        channel: Any,
        d: Delivery,
        settlement: Settlement,
        kind: str,
        parent: Context | None,
    ) -> DeliveryReport | None:
        """A confirmed retry copy into wait queue ``attempts``, then basic.ack; None when the
        wait queue would not take it (the reason noted: the DLQ takes it instead)."""
        assert d.message_id is not None
        wait = retry_wait(self.config.retry, settlement.attempts, self.uniform)
        copy = retry_copy(
            body=d.body,
            message_id=d.message_id,
            properties=d.properties_dict(),
            headers=d.headers,
            exchange=d.method.exchange,
            routing_key=d.method.routing_key,
            wait_queue=self.config.names.wait_queue(settlement.attempts),
            attempts=settlement.attempts,
            first_seen_at=d.first_seen_iso(),
            wait=wait,
        )
        what = f"retry copy of message_id={d.message_id}"
        try:
            self.engine.writer.write(connection, channel, copy, what, parent)
        except DeadLetterFailed as e:  # the wait queue would not take it: the DLQ instead
            d.notes += (str(e),)
            return None
        self.settle(channel, lambda: channel.basic_ack(d.delivery_tag), d)
        return d.report("retried", settlement.attempts, wait, kind)

    def _park(self, d: Delivery, error: DeadLetterFailed) -> None:
        """Leave a delivery the DLQ would not take unacked: the rest of the queue goes on, and
        it returns to the queue when this connection closes (and comes back, to be tried
        again). A channel full of parked deliveries can make no progress: stop then."""
        self.parked += 1
        self.parked_tags[d.delivery_tag] = str(error)
        if isinstance(error, RecordTooLarge):
            self.too_large.add(d.delivery_tag)
        self._multiple_ok = False
        log.warning("message_id=%s parked (left unacked): %s", d.message_id, error)
        if len(self.parked_tags) >= self.config.prefetch:
            self._stuck = DeadLetterFailed(
                f"{len(self.parked_tags)} deliveries parked, as many as the prefetch: the DLQ "
                f"takes nothing ({error})"
            )

    def end_of_run(self) -> None:
        """At the end of a run: raise DeadLetterFailed for deliveries parked because the DLQ
        took nothing (the worker must not look healthy); deliveries whose record fits no form
        (RecordTooLarge) are this outcome already - left in the queue, reported, logged."""
        stuck = {t: why for t, why in self.parked_tags.items() if t not in self.too_large}
        if stuck:  # on the last connection: the DLQ never took them
            raise DeadLetterFailed(
                f"{len(stuck)} deliveries could not be dead-lettered and went back "
                f"to queue {self.config.queue!r}: {list(stuck.values())[-1]}"
            )
        if self.too_large:
            log.warning(
                "%d deliveries too large for any DLQ record went back to queue %r (raise the "
                "broker's max_message_size, or move them): %s",
                len(self.too_large),
                self.config.queue,
                self.parked_tags[next(iter(self.too_large))],
            )

    def settle(self, channel: Any, settle: Callable[[], None], d: Delivery) -> None:
        """Settle on the delivering channel only (:meth:`ConsumerEngine.settle`)."""
        self.engine.settle(channel, settle, d)
