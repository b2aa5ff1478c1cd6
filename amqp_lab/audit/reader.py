"""An offset-tracking reader of a RabbitMQ stream over AMQP 0-9-1 (pika), e.g. the audit log
of :func:`~amqp_lab.topology.with_stream_audit` (https://www.rabbitmq.com/docs/streams).

A stream consumer needs a prefetch (basic.qos; without one the broker refuses basic.consume
with 406) and manual acks, which only return credit: an ack removes nothing from a stream.
basic.consume carries ``x-stream-offset`` (see :data:`~amqp_lab.audit.offsets.Start`; a
timestamp is sent as an AMQP timestamp, which pika writes for a ``datetime``), and every
delivery carries its offset in the ``x-stream-offset`` header.

With a reader name and an :class:`~amqp_lab.audit.offsets.OffsetStore`, the offset of the
last processed entry is stored every ``store_every`` entries and when the read ends (limit,
idle, an error), always *after* the entries were processed: at-least-once. After a crash
(no final store) the reader re-reads the entries processed since the last store.

Resuming asks for the *stored* offset itself and skips that entry: if the broker starts later,
retention removed entries the reader had not read, and :attr:`ReadReport.removed` counts them
(a stream cannot start "after" an offset that is gone, and offsets are not contiguous across
segments, so asking for stored + 1 could not tell a gap from a segment boundary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from amqp_lab.audit.offsets import OffsetStore, ReaderKey, Start, removed_before
from amqp_lab.connection import connect, drop_connection, translate
from amqp_lab.errors import AmqpLabError, NotFound, PreconditionFailed, QueueNotFound
from amqp_lab.message import properties_of
from amqp_lab.settings import BrokerSettings
from amqp_lab.state_key import broker_identity

__all__ = ["ReadReport", "StreamEntry", "StreamReader"]


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a stream: its ``offset``, the message's properties, and its body, as the
    lossless codec of :mod:`amqp_lab.wire` decoded them. ``message_id``: None when absent or
    not UTF-8; ``timestamp``: the AMQP timestamp (seconds) as a UTC datetime, None when absent
    or beyond datetime's range (year 9999); ``properties``: every basic property set, by name,
    exactly as it arrived (a message_id that is not UTF-8 as bytes, any timestamp as its int);
    ``headers`` the same, ``x-stream-offset`` included."""

    offset: int
    message_id: str | None
    exchange: str
    routing_key: str
    timestamp: datetime | None
    headers: dict[Any, Any]
    body: bytes
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReadReport:
    """How a read went. ``read``: entries handed to the callback; ``skipped``: (offset,
    reason) of the entries that could not be made a StreamEntry (never expected: the reader
    reads every legal AMQP value, and skips rather than stopping for good); ``first_offset`` /
    ``last_offset``: of the entries processed (read or skipped); ``resumed_from``: the stored
    offset it resumed after (None: started at ``start``); ``removed``: offsets retention
    removed before the reader got to them (an upper bound on messages); ``stopped``: ``limit``
    or ``idle``."""

    read: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    first_offset: int | None = None
    last_offset: int | None = None
    resumed_from: int | None = None
    removed: int = 0
    removed_range: tuple[int, int] | None = None
    stopped: str = ""
    stored: list[int] = field(default_factory=list)

    @property
    def gap(self) -> str | None:
        """One line on the gap retention left, or None when there was none."""
        if not self.removed or self.removed_range is None:
            return None
        low, high = self.removed_range
        return (
            f"{self.removed} entries were removed by retention before they were read "
            f"(offsets {low}..{high}; an upper bound on messages: the stream's tracking "
            "chunks take offsets too)"
        )


class StreamReader:
    """Reads one stream in ``settings``' vhost. ``prefetch``: deliveries in flight (basic.qos,
    required by streams); ``store``/``name``: where the reader's offset is kept (both or
    neither); ``store_every``: entries between two stores. Not thread-safe."""

    def __init__(
        self,
        settings: BrokerSettings,
        stream: str,
        *,
        prefetch: int = 500,
        store: OffsetStore | None = None,
        name: str | None = None,
        store_every: int = 500,
    ) -> None:
        if prefetch < 1 or store_every < 1:
            raise ValueError("prefetch and store_every must be >= 1")
        if (store is None) != (name is None):
            raise ValueError("give both an offset store and a reader name, or neither")
        self.settings = settings
        self.stream = stream
        self.prefetch = prefetch
        self.store = store
        self.key = (
            ReaderKey(settings.vhost, stream, name, broker_identity(settings))
            if name is not None
            else None
        )
        self.store_every = store_every

    def stored_offset(self) -> int | None:
        """The last processed offset stored for this reader (None: none, or no store)."""
        return self.store.get(self.key) if self.store and self.key else None

    def read(
        self,
        on_entry: Callable[[StreamEntry], None],
        start: Start = "next",
        *,
        limit: int | None = None,
        idle_timeout: float = 5.0,
        reset: bool = False,
    ) -> ReadReport:
        """Call ``on_entry`` for each entry, in offset order, from the stored offset (resume)
        or, when none is stored or ``reset``, from ``start``. Ends after ``limit`` entries, or
        when no entry came for ``idle_timeout`` seconds (the end of the stream, for now).

        Raises QueueNotFound (no such stream), PreconditionFailed (the queue is not a stream),
        BrokerConnectionError subclasses (e.g. ConnectionLost mid-read: what was processed is
        stored first), ConfigurationError (the offset file), and whatever ``on_entry`` raises
        (the entries before it are stored, that one is not)."""
        report = ReadReport()
        resume = None if reset else self.stored_offset()
        report.resumed_from = resume
        request: Start = resume if resume is not None else start
        expected = resume + 1 if resume is not None else (start if isinstance(start, int) else None)
        connection = None
        try:
            connection = connect(self.settings)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            unacked = 0
            for method, properties, body in channel.consume(
                self.stream,
                auto_ack=False,
                arguments={"x-stream-offset": request},
                inactivity_timeout=idle_timeout,
            ):
                if method is None:
                    report.stopped = "idle"
                    break
                headers = dict(properties.headers or {})
                if not isinstance(headers.get("x-stream-offset"), int):
                    raise PreconditionFailed(
                        f"queue {self.stream!r} is not a stream: its deliveries carry no "
                        "x-stream-offset",
                        406,
                    )
                offset = int(headers["x-stream-offset"])
                unacked += 1
                if unacked >= max(1, self.prefetch // 2):
                    channel.basic_ack(method.delivery_tag, multiple=True)
                    unacked = 0
                if resume is not None and offset <= resume:
                    continue  # the stored entry itself: it is still there, no gap
                if isinstance(request, int) and resume is None and offset < request:
                    continue
                if report.first_offset is None and expected is not None and offset > expected:
                    report.removed = removed_before(expected, offset)
                    report.removed_range = (expected, offset - 1)
                try:
                    entry = _entry(offset, method, properties, body)
                except Exception as e:  # never a reader's end: skipped, with the reason
                    report.skipped.append((offset, f"{type(e).__name__}: {e}"))
                else:
                    try:
                        on_entry(entry)
                    except BaseException as e:
                        raise _EntryFailed() from e
                    report.read += 1
                report.first_offset = offset if report.first_offset is None else report.first_offset
                report.last_offset = offset
                if (report.read + len(report.skipped)) % self.store_every == 0:
                    self._store(report)
                if limit is not None and report.read + len(report.skipped) >= limit:
                    report.stopped = "limit"
                    break
            # No basic.cancel: pika's would nack the deliveries it holds, which a stream refuses
            # by closing the connection (540); the connection is dropped instead (finally).
        except _EntryFailed as e:
            assert e.__cause__ is not None
            raise e.__cause__ from None
        except AmqpLabError:
            raise
        except Exception as e:
            error = translate(e, self.settings)
            if isinstance(error, NotFound):
                raise QueueNotFound(
                    f"stream {self.stream!r} does not exist in vhost {self.settings.vhost!r} "
                    "(apply the topology with setup_topology.py --audit stream)",
                    self.stream,
                    self.settings.vhost,
                ) from e
            if isinstance(error, PreconditionFailed):
                raise PreconditionFailed(
                    f"queue {self.stream!r} cannot be read as a stream: {error}", 406
                ) from e
            raise error from e
        finally:
            self._store(report)
            drop_connection(connection)
        return report

    def _store(self, report: ReadReport) -> None:
        """Store the last processed offset, if it moved (after processing: at-least-once)."""
        if self.store is None or self.key is None or report.last_offset is None:
            return
        if report.stored and report.stored[-1] == report.last_offset:
            return
        self.store.put(self.key, report.last_offset)
        report.stored.append(report.last_offset)


class _EntryFailed(Exception):
    """``on_entry`` raised (its exception is the cause): passed on as it is."""


def _entry(offset: int, method: Any, properties: Any, body: bytes) -> StreamEntry:
    """The entry for one delivery; total over every legal AMQP value (a timestamp past year
    9999 - which RabbitMQ accepts from any publisher - used to stop the reader for good)."""
    headers = properties.headers
    message_id = properties.message_id
    return StreamEntry(
        offset=offset,
        message_id=message_id if isinstance(message_id, str) else None,
        exchange=_text(method.exchange),
        routing_key=_text(method.routing_key),
        timestamp=_utc(properties.timestamp),
        headers=dict(headers) if isinstance(headers, dict) else {},
        body=bytes(body),
        properties={**properties_of(properties), **_set(message_id=message_id)},
    )


def _set(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _utc(stamp: Any) -> datetime | None:
    """An AMQP timestamp (seconds) as a UTC datetime; None when unset or out of range."""
    if not isinstance(stamp, int):
        return None
    try:
        return datetime.fromtimestamp(stamp, UTC)
    except (OverflowError, OSError, ValueError):
        return None
