"""DLQ operations: browse without consuming, depth alert, explicit replay and delete.

Browsing takes each message with basic.get (no auto-ack) and then returns all of them with
basic.nack(multiple=True, requeue=True): RabbitMQ puts requeued messages back in their original
position (https://www.rabbitmq.com/docs/confirms#consumer-nacks-requeue), so listing changes
nothing but the redelivered flag. Replay and delete hold a bounded window instead, whatever the
DLQ's size (:mod:`amqp_lab.dlq.window`). Nothing in amqp-lab consumes the DLQ automatically:
if the cause is still there, an automatic DLQ consumer is an infinite loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import open_channel, translate
from amqp_lab.dlq.view import DlqEntry, replay_message, view_of
from amqp_lab.dlq.window import (
    DEFAULT_MAX_HOLD,
    DEFAULT_WINDOW,
    Action,
    DlqPass,
    Held,
    PassReport,
    window_for_rate,
)
from amqp_lab.errors import AmqpLabError, ConfigurationError
from amqp_lab.observability.tracing import replay_span
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings

__all__ = [
    "PROGRESS_EVERY",
    "DeleteResult",
    "ReplayResult",
    "browse",
    "delete",
    "depth",
    "replay",
]

PROGRESS_EVERY = 100


@dataclass(frozen=True)
class _Held:
    delivery_tag: int
    entry: DlqEntry


@contextmanager
def _holding(
    settings: BrokerSettings,
    queue: str,
    limit: int | None,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[Any, list[_Held]]]:
    """basic.get up to ``limit`` messages (all when None) without acking; on exit nack the rest
    with requeue so they return to their place. ``on_progress(n)`` every 100 messages."""
    with open_channel(settings) as channel:
        held: list[_Held] = []
        try:
            while limit is None or len(held) < limit:
                method, properties, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                entry = view_of(body, properties)
                held.append(_Held(method.delivery_tag, entry))
                if on_progress is not None and len(held) % PROGRESS_EVERY == 0:
                    on_progress(len(held))
        except pe.ChannelClosedByBroker as e:
            raise translate(e, settings) from e
        try:
            yield channel, held
        finally:
            if channel.is_open:
                channel.basic_nack(0, multiple=True, requeue=True)
                # A synchronous call on the same channel reaches the queue after the requeue,
                # so when this returns the messages are back (other connections see them).
                channel.queue_declare(queue, passive=True)


def browse(
    settings: BrokerSettings,
    queue: str,
    limit: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> list[DlqEntry]:
    """The DLQ's messages, oldest first, left in the queue. Raises NotFound if it is missing."""
    with _holding(settings, queue, limit, on_progress) as (_, held):
        return [h.entry for h in held]


def depth(settings: BrokerSettings, queue: str) -> int:
    """Messages in ``queue`` now, via queue.declare(passive=True) (exact, not lagging stats)."""
    with open_channel(settings) as channel:
        try:
            result = channel.queue_declare(queue, passive=True)
        except pe.ChannelClosedByBroker as e:
            raise translate(e, settings) from e
    return int(result.method.message_count)


@dataclass(frozen=True)
class ReplayResult:
    entry: DlqEntry
    status: str  # replayed | would-replay | failed
    detail: str = ""


def replay(
    settings: BrokerSettings,
    select: Callable[[DlqEntry], bool],
    *,
    queue: str,
    dry_run: bool = False,
    exchange: str | None = None,
    limit: int | None = None,
    rate: float | None = None,
    on_result: Callable[[ReplayResult], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    window: int = DEFAULT_WINDOW,
    max_hold: float = DEFAULT_MAX_HOLD,
    in_order: bool = False,
    on_pass: Callable[[PassReport], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[ReplayResult]:
    """Republish the selected DLQ entries (at most ``limit``, at most ``rate`` per second) with
    confirms + mandatory: original payload, same message_id, attempts 0, x-death removed. Each
    DLQ copy is basic.ack'ed only after its replay was confirmed; a failed replay (unroutable,
    nacked...) leaves it in the DLQ. Replaying a message_id twice cannot apply it twice: the
    consumer's dedup store skips a message_id it has already processed.

    One bounded pass (:class:`~amqp_lab.dlq.window.DlqPass`): at most ``window`` messages
    unacked at once (fewer at a slow ``rate``: what it allows in half of ``max_hold`` seconds),
    each window settled within ``max_hold`` seconds; records not selected are moved to the
    DLQ's tail when the pass has to get past them. Records that arrive during the pass are left
    for the next one. A dry run moves nothing: it reads at most ``window`` records and puts them
    back (``on_pass`` tells whether that was all). ``in_order`` (a key's records): after a
    failed replay, the later selected records are not replayed (status failed, say why).
    ``on_pass`` gets the :class:`~amqp_lab.dlq.window.PassReport` when the pass ends. A rate
    whose wait is more than half of ``max_hold`` raises ConfigurationError (a record would stay
    unacked through it).

    Each replay is a ``replay <queue>`` span in the record's trace, whose context the replayed
    message carries (:func:`amqp_lab.observability.tracing.replay_span`). Raises NotFound
    (no ``queue``), ReplayStopped, ConnectionLost or a ChannelError when the pass stops early
    (what was replayed stays replayed, the rest is in the DLQ)."""
    interval = _interval(rate, max_hold)
    dlq_pass = DlqPass(
        settings,
        queue,
        window=window_for_rate(window, max_hold, rate),
        max_hold=max_hold,
        may_move=not dry_run,
        clock=clock,
        on_progress=on_progress,
    )
    replayer = _Replayer(select, queue, dry_run, exchange, interval, in_order, on_result, sleep)
    try:
        with Publisher(settings) as replayer.publisher:
            dlq_pass.run(replayer.act, lambda: limit is not None and len(replayer.results) >= limit)
    finally:
        if on_pass is not None:
            on_pass(dlq_pass.report)
    return replayer.results


def _interval(rate: float | None, max_hold: float) -> float:
    """Seconds between replays at ``rate`` per second (0: no limit). Raises
    ConfigurationError when a record would stay unacked through more than half ``max_hold``."""
    interval = 1.0 / rate if rate else 0.0
    if interval > max_hold / 2:
        raise ConfigurationError(
            f"a rate of {rate:g}/s waits {interval:g} s between replays, more than half the "
            f"{max_hold:g} s a record may stay unacked: use at least {2 / max_hold:g}/s, or "
            "replay a few at a time (--limit) from a timer"
        )
    return interval


class _Replayer:
    """What :func:`replay` does with each record its pass holds (``act``), and its results."""

    publisher: Publisher

    def __init__(
        self,
        select: Callable[[DlqEntry], bool],
        queue: str,
        dry_run: bool,
        exchange: str | None,
        interval: float,
        in_order: bool,
        on_result: Callable[[ReplayResult], None] | None,
        sleep: Callable[[float], None],
    ) -> None:
        self.select, self.queue, self.dry_run, self.exchange = select, queue, dry_run, exchange
        self.interval, self.in_order, self.on_result, self.sleep = (
            interval,
            in_order,
            on_result,
            sleep,
        )
        self.results: list[ReplayResult] = []
        self.replayed = self.failed = 0

    def report(self, result: ReplayResult) -> Action:
        self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)
        return "keep"

    def act(self, channel: Any, item: Held, deadline: float) -> Action:
        """Replay ``item`` if selected: publish (confirmed), then ack its DLQ copy."""
        entry = item.entry
        if not self.select(entry):
            return "keep"
        if self.in_order and self.failed:
            why = "not replayed: an earlier selected record failed (its order is kept)"
            return self.report(ReplayResult(entry, "failed", why))
        if not entry.message_id:
            # our publisher and dedup both need an id: this one stays in the DLQ
            return self.report(ReplayResult(entry, "failed", "no message_id: cannot be replayed"))
        if self.dry_run:
            return self.report(ReplayResult(entry, "would-replay"))
        if self.interval and self.replayed:
            self.sleep(self.interval)  # within the window: window_for_rate left room for it
        try:
            with replay_span(self.queue, entry.headers, entry.message_id):
                self.publisher.publish(replay_message(entry, self.exchange))
        except AmqpLabError as e:
            self.failed += 1
            return self.report(ReplayResult(entry, "failed", str(e)))
        try:
            channel.basic_ack(item.delivery_tag)
        except pe.AMQPError as e:  # the copy went out: say so (and audit it), then stop
            lost = f"its DLQ record stays, the ack was lost: {e}"
            self.report(ReplayResult(entry, "replayed", lost))
            raise
        self.replayed += 1
        self.report(ReplayResult(entry, "replayed"))
        return "done"


@dataclass(frozen=True)
class DeleteResult:
    entry: DlqEntry
    status: str  # deleted | would-delete | unconfirmed
    detail: str = ""


def delete(
    settings: BrokerSettings,
    select: Callable[[DlqEntry], bool],
    *,
    queue: str,
    dry_run: bool = False,
    limit: int | None = None,
    on_result: Callable[[DeleteResult], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    window: int = DEFAULT_WINDOW,
    max_hold: float = DEFAULT_MAX_HOLD,
    on_pass: Callable[[PassReport], None] | None = None,
) -> list[DeleteResult]:
    """Remove the selected DLQ entries (at most ``limit``) for good with basic.ack, in one
    bounded pass (:class:`~amqp_lab.dlq.window.DlqPass`: at most ``window`` unacked at once,
    records not selected moved to the tail when the pass must get past them). ``on_result``
    is called for a window's deletions only after a synchronous call on the same channel
    returned, i.e. once the broker has processed the acks. A dry run moves nothing: it reads at
    most ``window`` records and puts them back.

    Raises NotFound when ``queue`` is missing; ReplayStopped, ConnectionLost or a ChannelError
    when the pass stops early: the window's acks sent but not known to be processed are then
    reported first, status ``unconfirmed`` (deleted or back in the DLQ: list it to know), and
    everything unacked is back in the queue."""
    deleter = _Deleter(select, dry_run, on_result)
    dlq_pass = DlqPass(settings, queue, window=window, max_hold=max_hold, may_move=not dry_run)
    dlq_pass.on_progress = on_progress
    try:
        enough = lambda: limit is not None and deleter.count() >= limit  # noqa: E731
        dlq_pass.run(deleter.act, enough, deleter.confirmed)
        deleter.confirmed()  # a pass that ended in its first window: its last call was synchronous
    except AmqpLabError as e:
        deleter.unsure(e)
        raise
    finally:
        if on_pass is not None:
            on_pass(dlq_pass.report)
    if dry_run and on_result is not None:
        for result in deleter.results:
            on_result(result)
    return deleter.results


class _Deleter:
    """What :func:`delete` does with each record its pass holds (``act``): an ack, reported
    once the broker is known to have processed it (``confirmed``)."""

    def __init__(
        self,
        select: Callable[[DlqEntry], bool],
        dry_run: bool,
        on_result: Callable[[DeleteResult], None] | None,
    ) -> None:
        self.select, self.dry_run, self.on_result = select, dry_run, on_result
        self.results: list[DeleteResult] = []
        self.pending: list[DeleteResult] = []

    def count(self) -> int:
        return len(self.results) + len(self.pending)

    def act(self, channel: Any, item: Held, deadline: float) -> Action:
        if not self.select(item.entry):
            return "keep"
        if self.dry_run:
            self.results.append(DeleteResult(item.entry, "would-delete"))
            return "keep"
        channel.basic_ack(item.delivery_tag)
        self.pending.append(DeleteResult(item.entry, "deleted"))
        return "done"

    def confirmed(self) -> None:
        self.results.extend(self.pending)
        if self.on_result is not None:
            for result in self.pending:
                self.on_result(result)
        self.pending.clear()

    def unsure(self, error: AmqpLabError) -> None:
        """The pass stopped: the acks sent but not known to be processed."""
        for result in self.pending:
            unsure = DeleteResult(result.entry, "unconfirmed", f"ack sent, then: {error}")
            self.results.append(unsure)
            if self.on_result is not None:
                self.on_result(unsure)
        self.pending.clear()
