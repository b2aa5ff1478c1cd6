"""A bounded pass over a DLQ: replay and delete hold at most a window of messages unacked,
each for less than a time bound, whatever the DLQ's size.

basic.get hands out the queue's head; a message put back with basic.nack(requeue) returns to
the head of a classic queue, so the next basic.get returns it again. To get past records it does not
select without holding them all, a pass **moves** them: a copy, exactly as it was (body, every
property, every header byte for byte - raw DLX entries keep their x-death), is published to the
DLQ's tail through the default exchange with a publisher confirm, and only then is the original
acked. A pass goes once round the records the DLQ held when it started (its depth, by passive
queue.declare) and stops there, so it never meets its own copies.

* **Window.** At most ``window`` deliveries are unacked at once (:attr:`PassReport.max_unacked`
  counts them on the channel); each window's deliveries are settled - done or moved - within
  ``max_hold`` seconds, below any consumer timeout (RabbitMQ's delivery acknowledgement
  timeout, 30 min by default, applies to basic.get too and closes the channel:
  https://www.rabbitmq.com/docs/consumers#acknowledgement-timeout). A rate limit's waits are
  part of the window, so a slow rate gets a smaller one (:func:`window_for_rate`); a broker so
  slow that a window still runs past the bound stops the pass with ReplayStopped.
* **Order.** basic.nack(requeue) keeps a message's place in a classic queue, but a quorum queue
  of RabbitMQ 3.10 or 4.0 (and 4.3 in some cases) appends it to the tail (checked on 3.10.8,
  4.0.5, 4.3.6). So a pass puts records back only when they are all the DLQ holds (a DLQ that
  fits one window and gets nothing new meanwhile): their order then holds on every queue type.
  Otherwise it moves every record it keeps and, once it has moved one, goes round the whole
  depth (even after a --limit is reached), so the records left keep their order. Records that
  **arrive during the pass** are not examined (left for the next run) and land at the tail
  among the moved ones: a key with records on both sides of that line can find an older record
  behind a newer one.
* **A dry run** moves nothing: it reads one window and puts it back (on a quorum DLQ larger
  than the window, those records then go to its tail, as with ``dlq.py --limit``).
* **A closed channel or connection** (consumer timeout, a node restart, a forced close) returns
  every unacked delivery to the DLQ; nothing is lost. The pass looks for a close before each
  record, so at most the record in flight completed its action and lost its ack: a replayed one
  is replayed again by the next run (the consumer's dedup store absorbs it; the audit log has
  both); a moved one is then in the DLQ twice (same message_id, one copy at the tail; replaying
  both applies it once). A pass cut short after moving records leaves the DLQ rotated: the
  moved ones after the rest, each part in its order.
* **Moving needs** write permission on the default exchange (``amq.default``), and cannot copy
  a record whose ``user_id`` property names another user (the broker would refuse the copy) or
  that the DLQ refuses (a length limit with ``reject-publish``): the pass stops with
  ReplayStopped before touching it, everything put back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal

import pika.exceptions as pe

from amqp_lab.connection import open_channel, translate
from amqp_lab.dlq.view import DlqEntry, view_of
from amqp_lab.errors import ReplayStopped
from amqp_lab.settings import BrokerSettings
from amqp_lab.wire import AmqpProperties

__all__ = [
    "DEFAULT_MAX_HOLD",
    "DEFAULT_WINDOW",
    "Action",
    "DlqPass",
    "Held",
    "PassReport",
    "exact_properties",
    "window_for_rate",
]

DEFAULT_WINDOW = 100
"""Deliveries a pass holds unacked at most, by default."""
DEFAULT_MAX_HOLD = 60.0
"""Seconds a window's deliveries stay unacked at most, by default: far below RabbitMQ's default
consumer timeout (30 min) and at its smallest sensible setting (it is checked once a minute)."""
Action = Literal["done", "keep"]
"""What a pass's caller did with a record: ``done`` - settled it for good (replayed, deleted:
acked); ``keep`` - it stays in the DLQ."""

_PROPERTIES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


@dataclass(frozen=True)
class Held:
    """One DLQ delivery a pass holds: its delivery tag, the entry as people read it, and the
    exact body and properties (for a move)."""

    delivery_tag: int
    entry: DlqEntry
    body: bytes
    properties: Any


@dataclass
class PassReport:
    """What a pass did. ``depth``: records in the DLQ at the start (ready); ``examined``: of
    them, looked at; ``removed``: settled for good by the caller; ``moved``: copied to the tail;
    ``max_unacked``: most deliveries held at once; ``windows``: basic.get rounds; ``depth_after``:
    records ready at the end (-1: unknown, the pass failed), arrivals during the pass included."""

    depth: int = 0
    examined: int = 0
    removed: int = 0
    moved: int = 0
    max_unacked: int = 0
    windows: int = 0
    depth_after: int = -1

    @property
    def complete(self) -> bool:
        """Whether every record present at the start was examined."""
        return self.examined >= self.depth

    def line(self) -> str:
        """One line for people."""
        after = "?" if self.depth_after < 0 else str(self.depth_after)
        return (
            f"DLQ: {self.depth} records at the start, {self.examined} examined, "
            f"{self.moved} moved to its tail, {after} now "
            f"(at most {self.max_unacked} held at once)"
        )


def window_for_rate(window: int, max_hold: float, rate: float | None) -> int:
    """The window a pass at ``rate`` messages per second settles in half of ``max_hold``
    seconds (the other half for the broker's answers): ``window``, or fewer for a slow rate
    (at least 1)."""
    if not rate:
        return window
    return max(1, min(window, int(rate * max_hold / 2)))


def exact_properties(properties: Any) -> AmqpProperties:
    """``properties`` (as :class:`~amqp_lab.wire.AmqpProperties` decoded them) encoded again to
    the same bytes, sealed: every property, the header table through the lossless codec, and a
    table that could not be decoded (``undecodable_headers``) spliced back in as it came."""
    copy = AmqpProperties()
    for name in _PROPERTIES:
        setattr(copy, name, getattr(properties, name, None))
    raw = getattr(properties, "undecodable_headers", None)
    if raw is None:
        return copy.seal()
    copy.headers = {}  # a placeholder of 4 bytes (an empty table) where the raw table goes
    flags, rest = copy.encode()
    offset = sum(
        1 + len(value.encode() if isinstance(value, str) else value)
        for value in (copy.content_type, copy.content_encoding)
        if value is not None
    )
    copy._sealed = flags + rest[:offset] + raw + rest[offset + 4 :]
    return copy


class DlqPass:
    """One bounded pass over ``queue``: :meth:`run` calls ``act`` on each record, in DLQ
    order, holding at most ``window`` deliveries for at most ``max_hold`` seconds. With
    ``may_move=False`` (a dry run) nothing moves: the pass reads at most one window and puts it
    back. Raises ValueError for a window < 1 or max_hold <= 0."""

    def __init__(
        self,
        settings: BrokerSettings,
        queue: str,
        *,
        window: int = DEFAULT_WINDOW,
        max_hold: float = DEFAULT_MAX_HOLD,
        may_move: bool = True,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        if window < 1 or not max_hold > 0:
            raise ValueError("a pass needs a window >= 1 and max_hold > 0 seconds")
        self.settings, self.queue = settings, queue
        self.window, self.max_hold, self.may_move = window, max_hold, may_move
        self.clock, self.on_progress = clock, on_progress
        self.report = PassReport()

    def run(
        self,
        act: Callable[[Any, Held, float], Action],
        finished: Callable[[], bool] = lambda: False,
        after_window: Callable[[], None] | None = None,
    ) -> PassReport:
        """Go once round the DLQ. ``act(channel, held, deadline)`` decides each record (it may
        basic.ack ``held.delivery_tag`` on ``channel`` and answer ``done``; ``deadline`` is the
        monotonic time by which the window must be settled); ``finished()`` true: act on no
        more records (a --limit reached); ``after_window()`` runs once a window's acks are
        known to be processed (a synchronous call on the channel returned).

        Raises NotFound when the queue is missing; ReplayStopped when a record cannot be moved
        or a window could not be settled within ``max_hold`` (a slow broker); ConnectionLost
        (or the ChannelError the broker closed the channel with) when the channel dies. Every
        delivery not settled is then back in the DLQ."""
        report = self.report
        with open_channel(self.settings) as channel:
            try:
                report.depth = self._ready(channel)
                if self.may_move:
                    channel.confirm_delivery()
                moved_any = False
                while report.examined < report.depth:
                    held = self._take(channel, min(self.window, report.depth - report.examined))
                    if not held:
                        break  # someone else took the rest
                    deadline = self.clock() + self.max_hold
                    keep, late = self._decide(channel, held, act, finished, deadline)
                    report.examined += len(held) - len(late)
                    if self.on_progress is not None:
                        self.on_progress(report.examined)
                    if not self.may_move:
                        self._put_back(channel)  # a dry run: one window, back where it was
                        break
                    over = report.examined >= report.depth or finished()
                    if over and not moved_any and (not keep or self._holds_all(channel)):
                        self._put_back(channel)  # nothing moved, nothing else in the DLQ
                        break
                    for item in keep:
                        self._move(channel, item)
                        moved_any = True
                    if late:
                        raise self._too_slow(len(late))
                    self._ready(channel)  # the acks and moves are processed
                    if after_window is not None:
                        after_window()
                report.depth_after = self._ready(channel)
            except pe.AMQPError as e:
                raise translate(e, self.settings) from e
            finally:
                if channel.is_open:  # an error: what is still held goes back to the DLQ
                    # (failing that, the connection closes next, which puts them back as well)
                    with suppress(pe.AMQPError):
                        channel.basic_nack(0, multiple=True, requeue=True)
        return report

    def _ready(self, channel: Any) -> int:
        return int(channel.queue_declare(self.queue, passive=True).method.message_count)

    def _holds_all(self, channel: Any) -> bool:
        """Whether the deliveries held are all the DLQ has: then putting them back with
        basic.nack(requeue) keeps their order on every queue type. (A classic queue puts a
        requeued message back at its place; a quorum queue of RabbitMQ 3.10 or 4.0 appends it
        to the tail, checked on 3.10.8, 4.0.5 and 4.3.6.)"""
        return self._ready(channel) == 0

    def _too_slow(self, late: int) -> ReplayStopped:
        return ReplayStopped(
            f"{late} records of {self.queue!r} could not be handled within {self.max_hold:g} s "
            "of taking them (the broker answered slowly): the pass stopped to stay inside the "
            "consumer timeout; they are back in the DLQ (a quorum DLQ puts them at its tail), "
            "nothing was lost - run it again"
        )

    def _take(self, channel: Any, count: int) -> list[Held]:
        held: list[Held] = []
        while len(held) < count:
            method, properties, body = channel.basic_get(self.queue, auto_ack=False)
            if method is None:
                break
            held.append(Held(method.delivery_tag, view_of(body, properties), body, properties))
        self.report.max_unacked = max(self.report.max_unacked, len(held))
        self.report.windows += 1
        return held

    def _decide(
        self,
        channel: Any,
        held: list[Held],
        act: Callable[[Any, Held, float], Action],
        finished: Callable[[], bool],
        deadline: float,
    ) -> tuple[list[Held], list[Held]]:
        """Split ``held`` into the records kept and those not reached before ``deadline``
        (``act`` ran on the rest, in order, until ``finished()``)."""
        keep: list[Held] = []
        late: list[Held] = []
        for item in held:
            if late or self.clock() >= deadline:
                late.append(item)
                continue
            if finished():
                keep.append(item)
                continue
            self._alive(channel)  # a closed channel is found before the next publish
            if act(channel, item, deadline) == "done":
                self.report.removed += 1
            else:
                keep.append(item)
        return keep, late

    def _alive(self, channel: Any) -> None:
        """Read what the broker sent meanwhile (without waiting) and raise, with the broker's
        reason, if it closed the channel: otherwise an ack sent into the closed channel would
        look settled and its record, back in the DLQ, would be replayed again next run."""
        channel.connection.process_data_events(time_limit=0)
        if channel.is_open:
            return
        reason = getattr(channel, "_closing_reason", None)  # pika keeps the broker's Close
        if isinstance(reason, pe.AMQPError):
            raise reason
        raise pe.ChannelWrongStateError("the DLQ channel was closed")

    def _move(self, channel: Any, item: Held) -> None:
        """Publish ``item``'s exact copy to the tail (confirmed), then ack the original."""
        self._alive(channel)
        who = item.properties.user_id
        if who is not None and who != self.settings.username:
            raise ReplayStopped(
                f"cannot move message_id={item.entry.message_id!r} past the window: its "
                f"user_id {who!r} is not this connection's user, so the broker would refuse the "
                "copy; replay or delete it first (--message-id), or run as that user. Every "
                "record is still in the DLQ"
            )
        try:
            channel.basic_publish(
                "", self.queue, item.body, exact_properties(item.properties), mandatory=True
            )
        except (pe.UnroutableError, pe.NackError) as e:
            why = "returned unroutable" if isinstance(e, pe.UnroutableError) else "nacked"
            raise ReplayStopped(
                f"moving message_id={item.entry.message_id!r} to the tail of {self.queue!r}: "
                f"the copy was {why} (a length limit with reject-publish?); the pass stopped, "
                "every record is still in the DLQ"
            ) from e
        channel.basic_ack(item.delivery_tag)
        self.report.moved += 1

    @staticmethod
    def _put_back(channel: Any) -> None:
        """basic.nack(multiple, requeue) every delivery still held: back to its place."""
        channel.basic_nack(0, multiple=True, requeue=True)
