"""An outbox row and the message it stands for, both ways (pure: no I/O).

:func:`row_values` turns an :class:`~amqp_lab.message.OutgoingMessage` (with its ordering
key, due time and the writer's trace context) into the values :func:`amqp_lab.outbox.add`
inserts, refusing what no relay could ever send: the checks of
:meth:`~amqp_lab.message.OutgoingMessage.sealed_properties` run in the writer's transaction,
so the writer learns at once. :func:`message_of` turns a leased row back into the message;
a row it cannot read - written by hand, by another version, damaged - raises
:class:`RowUndecodable`, and the relay parks that row with the reason instead of stopping.

Headers are stored as the AMQP field table's wire bytes (:mod:`amqp_lab.fieldtable`): every
type AMQP has - decimals, timestamps, nested tables, byte arrays - comes back with its type and
bytes. The other properties are standard JSON.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from amqp_lab.errors import ConfigurationError, UnencodableMessage
from amqp_lab.fieldtable import FieldTableError, decode_table, encode_table
from amqp_lab.message import KEY_HEADER, OutgoingMessage, decode_json, encode_json

__all__ = [
    "CACHED_PROPERTIES_CHARS",
    "OutboxRow",
    "RowUndecodable",
    "RowValues",
    "UndecodableText",
    "due_seconds",
    "message_of",
    "ordering_key_of",
    "property_fields",
    "row_values",
]

_TEXT_PROPERTIES = (
    "content_type",
    "content_encoding",
    "type",
    "expiration",
    "correlation_id",
    "reply_to",
    "app_id",
)
_INT_PROPERTIES = ("priority", "timestamp")


class RowUndecodable(ValueError):
    """An outbox row that is no message: its properties are not the JSON object
    :func:`row_values` writes, its headers no AMQP field table, a column of the wrong type."""


class UndecodableText(str):
    """A SQLite text value that is not UTF-8 (a row written by hand or by another program):
    the text with U+FFFD in place of its bad bytes, which the status and the operator's
    commands show, and the stored bytes, ``raw``, which a statement binds to find it again
    (:func:`amqp_lab.outbox.sql.bound`; equal and hashed by them). The relay parks a row
    whose message_id, key, exchange, routing key or properties is one (:func:`message_of`)
    and drops such a trace context."""

    raw: bytes

    def __new__(cls, raw: bytes) -> UndecodableText:
        text = super().__new__(cls, raw.decode(errors="replace"))
        text.raw = raw
        return text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UndecodableText) and other.raw == self.raw

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.raw)

    def __reduce__(self) -> tuple[type[UndecodableText], tuple[bytes]]:  # copy, pickle
        return UndecodableText, (self.raw,)


def sqlite_text(value: bytes) -> str:
    """A SQLite connection's ``text_factory``: the column as UTF-8, or an
    :class:`UndecodableText` - without it one such value failed every read of its row
    ("Could not decode to UTF-8 column ...", every lease: the relay stopped)."""
    try:
        return value.decode()
    except UnicodeDecodeError:
        return UndecodableText(value)


@dataclass(frozen=True)
class RowValues:
    """What :func:`amqp_lab.outbox.add` inserts for one message (``due_at``: epoch seconds or
    None for at once)."""

    message_id: str
    ordering_key: str | None
    exchange: str
    routing_key: str
    properties: str
    headers: bytes
    body: bytes
    traceparent: str | None
    tracestate: str | None
    due_at: float | None


class OutboxRow(NamedTuple):
    """A row a relay leased: ``id`` (commit order within a key), the stored columns, the
    database's ``created_at`` / ``due_at`` (epoch seconds) and ``tries`` (leases so far, this
    one included). A named tuple, not a frozen dataclass: a relay makes one per row it
    leases, and a frozen dataclass's constructor (a call per field) took 3 us of the 12 us
    its leasing thread spends on a row (py-spy, 60,000 rows, docs/benchmarks.md)."""

    id: int
    message_id: str
    ordering_key: str | None
    exchange: str
    routing_key: str
    properties: str
    headers: bytes
    body: bytes
    traceparent: str | None
    tracestate: str | None
    created_at: float
    due_at: float | None
    tries: int

    @property
    def size(self) -> int:
        """Bytes of body and headers: what the relay holds in memory for it."""
        return len(self.body) + len(self.headers)

    @property
    def due(self) -> float:
        """When the row was to go: its due time, or its creation for one not scheduled."""
        return self.created_at if self.due_at is None else max(self.created_at, self.due_at)


def due_seconds(due_at: float | datetime | None) -> float | None:
    """``due_at`` as epoch seconds: a timezone-aware datetime or a finite number of seconds
    since the epoch (None: at once). Raises ConfigurationError for a naive datetime (its zone
    would be a guess), NaN, an infinity, a bool or another type."""
    if due_at is None:
        return None
    if isinstance(due_at, datetime):
        if due_at.tzinfo is None or due_at.utcoffset() is None:
            raise ConfigurationError(
                f"due_at {due_at.isoformat()} has no time zone: give an aware datetime "
                "(datetime.now(timezone.utc) + ...) or epoch seconds"
            )
        return due_at.timestamp()
    if isinstance(due_at, bool) or not isinstance(due_at, int | float):
        raise ConfigurationError(f"due_at must be a datetime or epoch seconds, not {due_at!r}")
    try:
        seconds = float(due_at)  # an int past a float's range: OverflowError
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ConfigurationError(f"due_at must be a finite time, not {due_at!r:.40}")
    return seconds


def ordering_key_of(message: OutgoingMessage, key: str | None) -> str | None:
    """The row's ordering key: ``key`` if given, else the message's ``key`` header when it is
    text (:func:`~amqp_lab.message.message_for` ``key=`` writes it), else None (no order).
    Raises ConfigurationError for a key that is empty or not Unicode text."""
    if key is None:
        header = message.headers.get(KEY_HEADER)
        key = header if isinstance(header, str) and header else None
        if key is None:
            return None
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"an ordering key must be a non-empty str, not {key!r:.80}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigurationError(f"the ordering key {key!r:.80} is not Unicode text") from e
    return key


def row_values(
    message: OutgoingMessage,
    key: str | None = None,
    due_at: float | datetime | None = None,
    trace: tuple[str | None, str | None] = (None, None),
) -> RowValues:
    """The row for ``message``. Raises UnencodableMessage (naming the message_id and the
    field) for a message the broker would refuse or AMQP cannot carry - the checks of
    ``sealed_properties`` - or a consumer would dead-letter unread (no message_id, or one
    holding a NUL character), and ConfigurationError for a bad ``key`` or ``due_at``."""
    if not isinstance(message.message_id, str) or not message.message_id:
        raise UnencodableMessage("an outbox message needs a message_id", None)
    if "\x00" in message.message_id:  # PostgreSQL text cannot hold it; no consumer takes it
        raise UnencodableMessage(
            f"message_id={message.message_id!r}: a NUL character (U+0000) in a message_id",
            message.message_id,
        )
    if not isinstance(message.body, bytes | bytearray):
        raise UnencodableMessage(
            f"message_id={message.message_id!r}: the body must be bytes (message_for encodes "
            f"JSON), not {type(message.body).__name__}",
            message.message_id,
        )
    message.sealed_properties()  # raises UnencodableMessage
    try:
        headers = encode_table(message.headers)
    except FieldTableError as e:  # sealed_properties checked it: only a race could get here
        raise UnencodableMessage(f"message_id={message.message_id!r}: {e}") from e
    properties: dict[str, Any] = {"persistent": bool(message.persistent)}
    for name in (*_TEXT_PROPERTIES, *_INT_PROPERTIES):
        value = getattr(message, name)
        if value is not None:
            properties[name] = value
    traceparent, tracestate = trace
    return RowValues(
        message_id=message.message_id,
        ordering_key=ordering_key_of(message, key),
        exchange=message.exchange,
        routing_key=message.routing_key,
        properties=encode_json(properties).decode(),
        headers=headers,
        body=bytes(message.body),
        traceparent=traceparent,
        tracestate=tracestate,
        due_at=due_seconds(due_at),
    )


def _holds(name: str, value: Any) -> bool:
    """Whether ``value`` is what a row's property ``name`` can hold."""
    if name in _TEXT_PROPERTIES:
        return isinstance(value, str)
    if name in _INT_PROPERTIES:
        return isinstance(value, int) and not isinstance(value, bool)
    return name == "persistent" and isinstance(value, bool)


CACHED_PROPERTIES_CHARS = 2048
"""A properties column longer than this is parsed each time, never cached: a hostile table
(long texts, each different) cannot grow the cache past 1,024 entries of at most 2,048
characters each, and their parsed values (up to 4 bytes a character as text: up to about
16 MiB in all)."""


def property_fields(text: str) -> tuple[tuple[str, Any], ...]:
    """A row's ``properties`` column as (name, value) pairs (:func:`_parse_properties`),
    from the cache when it is short. Raises RowUndecodable."""
    if len(text) > CACHED_PROPERTIES_CHARS:
        return _parse_properties.__wrapped__(text)
    return _parse_properties(text)


@functools.lru_cache(maxsize=1024)
def _parse_properties(text: str) -> tuple[tuple[str, Any], ...]:
    """A ``properties`` column as (name, value) pairs. Cached: the rows of one application
    carry few distinct property sets (the message_id and headers are columns of their own),
    and the values are immutable (str, int, bool). Raises RowUndecodable (not cached: a bad
    row is read again each time, and fails again)."""
    try:
        properties = decode_json(text)
    except (ValueError, RecursionError) as e:
        raise RowUndecodable(f"column properties is not standard JSON: {e}") from e
    if not isinstance(properties, dict):
        raise RowUndecodable("column properties is not a JSON object")
    for name, value in properties.items():
        if not _holds(name, value):
            raise RowUndecodable(f"property {name!r} = {value!r:.80} is not one a row holds")
    return tuple(properties.items())


def message_of(row: OutboxRow) -> OutgoingMessage:
    """The message ``row`` stands for (its headers without any trace context: the relay adds
    the stored one). Raises RowUndecodable, with the reason, for a row that is none."""
    if not isinstance(row.message_id, str) or not row.message_id:
        raise RowUndecodable("the row has no message_id")
    for name in ("exchange", "routing_key", "properties"):
        if not isinstance(getattr(row, name), str):
            raise RowUndecodable(f"column {name} is not text")
    for name in ("message_id", "ordering_key", "exchange", "routing_key", "properties"):
        if isinstance(getattr(row, name), UndecodableText):
            raise RowUndecodable(f"column {name} is not UTF-8 text")
    if not isinstance(row.body, bytes | bytearray | memoryview):
        raise RowUndecodable(f"column body is {type(row.body).__name__}, not bytes")
    fields = dict(property_fields(row.properties))
    try:
        raw = bytes(row.headers)
        headers, end = decode_table(raw)
    except (FieldTableError, TypeError) as e:
        raise RowUndecodable(f"column headers is not an AMQP field table: {e}") from e
    if end != len(raw):
        raise RowUndecodable(f"column headers has {len(raw) - end} bytes after its field table")
    return OutgoingMessage(
        body=bytes(row.body),
        message_id=row.message_id,
        exchange=row.exchange,
        routing_key=row.routing_key,
        headers=headers,
        **fields,
    )
