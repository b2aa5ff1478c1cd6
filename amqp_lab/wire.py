"""Message properties on the wire, with :mod:`amqp_lab.fieldtable`'s lossless header codec.

pika decodes every content header with ``pika.spec.props[60]`` (BasicProperties). Its header
codec truncates floats to ints and raises OverflowError on a timestamp past year 9999, inside
the frame decoder: the connection dies, the broker redelivers the message to the next consumer,
and that one dies too (checked on pika 1.4.4 against RabbitMQ 3.10 and 4.0). Importing this
module (:mod:`amqp_lab.connection`, the pika boundary, does) registers :class:`AmqpProperties`
there instead, for the whole process: same attributes and behaviour as pika's class, every
header value decoded, and a table that still cannot be decoded kept as raw bytes in
``undecodable_headers`` (with ``headers`` None) rather than raising. The consumer
dead-letters such a delivery as a business error instead of losing its connection.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import pika.spec

from amqp_lab.fieldtable import FieldTableError, decode_table, encode_table

__all__ = ["AmqpProperties", "PropertiesTemplate", "SealedProperties", "install"]

# (attribute, kind) in flag order, bit 15 first: s short string, F table, o octet, Q timestamp
_FIELDS = (
    ("content_type", "s"),
    ("content_encoding", "s"),
    ("headers", "F"),
    ("delivery_mode", "o"),
    ("priority", "o"),
    ("correlation_id", "s"),
    ("reply_to", "s"),
    ("expiration", "s"),
    ("message_id", "s"),
    ("timestamp", "Q"),
    ("type", "s"),
    ("user_id", "s"),
    ("app_id", "s"),
    ("cluster_id", "s"),
)
_SPEC = tuple((1 << (15 - i), name, kind) for i, (name, kind) in enumerate(_FIELDS))
_PACK_H, _UNPACK_H = struct.Struct(">H").pack, struct.Struct(">H").unpack_from
_PACK_Q, _UNPACK_Q = struct.Struct(">Q").pack, struct.Struct(">Q").unpack_from
# flags word -> the (attribute, kind) of each property it sets: a queue's messages carry few
# combinations, and a flags word has 2**16 values at most, so this stays bounded
_PLANS: dict[int, tuple[tuple[str, str], ...]] = {}


def _plan(flags: int) -> tuple[tuple[str, str], ...]:
    """The properties a content header with this first flags word carries, in wire order."""
    return tuple((name, kind) for bit, name, kind in _SPEC if flags & bit)


class AmqpProperties(pika.spec.BasicProperties):  # type: ignore[misc]
    """pika's BasicProperties with the lossless field-table codec.

    ``encode()`` raises :class:`~amqp_lab.fieldtable.FieldTableError` (naming the property or
    header) for a value AMQP cannot carry: a short string over 255 bytes, an octet outside
    0..255, a header value of an unsupported type. :meth:`seal` encodes once and keeps the
    bytes, so a publisher validates in the caller's thread and sends without encoding again."""

    undecodable_headers: bytes | None = None
    header_error: str | None = None
    _sealed: bytes | None = None

    def seal(self) -> AmqpProperties:
        """Encode now (raising FieldTableError if it cannot be) and reuse the bytes from then
        on; the properties must not change afterwards."""
        self._sealed = None
        self._sealed = b"".join(self.encode())
        return self

    def encode(self) -> list[bytes]:
        """The encoded properties as a new list (pika inserts the frame header into it).
        Unrolled in flag order: this runs once per published message."""
        if self._sealed is not None:
            return [self._sealed]
        out = bytearray()
        flags = 0
        if (v := self.content_type) is not None:
            flags |= 0x8000
            _short(out, v, "content_type")
        if (v := self.content_encoding) is not None:
            flags |= 0x4000
            _short(out, v, "content_encoding")
        if (v := self.headers) is not None:
            flags |= 0x2000
            out += encode_table(v)
        if (v := self.delivery_mode) is not None:
            flags |= 0x1000
            out.append(_octet(v, "delivery_mode"))
        if (v := self.priority) is not None:
            flags |= 0x0800
            out.append(_octet(v, "priority"))
        if (v := self.correlation_id) is not None:
            flags |= 0x0400
            _short(out, v, "correlation_id")
        if (v := self.reply_to) is not None:
            flags |= 0x0200
            _short(out, v, "reply_to")
        if (v := self.expiration) is not None:
            flags |= 0x0100
            _short(out, v, "expiration")
        if (v := self.message_id) is not None:
            flags |= 0x0080
            _short(out, v, "message_id")
        if (v := self.timestamp) is not None:
            flags |= 0x0040
            _timestamp(out, v)
        if (v := self.type) is not None:
            flags |= 0x0020
            _short(out, v, "type")
        if (v := self.user_id) is not None:
            flags |= 0x0010
            _short(out, v, "user_id")
        if (v := self.app_id) is not None:
            flags |= 0x0008
            _short(out, v, "app_id")
        if (v := self.cluster_id) is not None:
            flags |= 0x0004
            _short(out, v, "cluster_id")
        return [_PACK_H(flags), bytes(out)]

    def decode(self, encoded: bytes, offset: int = 0) -> AmqpProperties:
        """Decode a content header's property list (pika calls this on a fresh instance, whose
        ``__init__`` set every property to None): only the properties whose flag is set are
        visited, in the order of the field plan for these flags (:func:`_plan`)."""
        (flags,) = _UNPACK_H(encoded, offset)
        offset += 2
        word = flags
        while word & 1:  # continuation flag words: AMQP 0-9-1 defines no property there
            (word,) = _UNPACK_H(encoded, offset)
            offset += 2
        fields = self.__dict__
        plan = _PLANS.get(flags)
        if plan is None:
            plan = _PLANS[flags] = _plan(flags)
        for name, kind in plan:
            if kind == "s":
                end = offset + 1 + encoded[offset]
                raw = encoded[offset + 1 : end]
                offset = end
                try:
                    fields[name] = raw.decode()
                except UnicodeDecodeError:
                    fields[name] = bytes(raw)
            elif kind == "F":
                fields[name], offset = self._decode_headers(encoded, offset)
            elif kind == "o":
                fields[name] = encoded[offset]
                offset += 1
            else:
                (fields[name],) = _UNPACK_Q(encoded, offset)
                offset += 8
        return self

    def _decode_headers(self, encoded: bytes, offset: int) -> tuple[Any, int]:
        (size,) = struct.unpack_from(">I", encoded, offset)
        end = offset + 4 + size
        try:
            table, after = decode_table(encoded, offset)
        except FieldTableError as e:
            self.undecodable_headers = bytes(encoded[offset:end])
            self.header_error = str(e)
            return None, end
        return table, after


class SealedProperties:
    """Basic properties already encoded (``data``: the flags word and the property list, what
    :meth:`AmqpProperties.encode` returns, joined), holding only what pika's content-header
    frame asks of a properties object: ``INDEX`` and ``encode()``. Made by
    :meth:`PropertiesTemplate.seal`, for a publisher that encodes without a properties
    object per message (the outbox relay)."""

    __slots__ = ("data",)
    INDEX = pika.spec.BasicProperties.INDEX

    def __init__(self, data: bytes) -> None:
        self.data = data

    def encode(self) -> list[bytes]:
        """The encoded properties as a new list (pika inserts the frame header into it)."""
        return [self.data]


_HEADERS_FLAG, _MESSAGE_ID_FLAG, _TIMESTAMP_FLAG = 0x2000, 0x0080, 0x0040


@dataclass(frozen=True)
class PropertiesTemplate:
    """The encoded basic properties of messages that differ only in their headers, message_id
    and (when ``timestamp`` is None) timestamp: the other properties encoded once, by
    :meth:`AmqpProperties.encode` itself, in the three runs of the wire order those three
    fields split them into (``head``: content_type, content_encoding; ``middle``:
    delivery_mode to expiration; ``tail``: type to cluster_id). ``flags``: their flag bits
    and message_id's (and timestamp's when it is fixed); ``timestamp``: the fixed timestamp's
    8 bytes, or None for the time of sealing."""

    flags: int
    head: bytes
    middle: bytes
    timestamp: bytes | None
    tail: bytes

    @classmethod
    def of(cls, properties: AmqpProperties) -> PropertiesTemplate:
        """The template of ``properties`` (their headers and message_id are not looked at; a
        timestamp of None means the time of each :meth:`seal`). Raises FieldTableError as
        :meth:`AmqpProperties.encode` does."""

        def run(*names: str) -> tuple[int, bytes]:
            flags, data = AmqpProperties(**{n: getattr(properties, n) for n in names}).encode()
            return _UNPACK_H(flags)[0], data

        head_flags, head = run("content_type", "content_encoding")
        middle_flags, middle = run(
            "delivery_mode", "priority", "correlation_id", "reply_to", "expiration"
        )
        stamp_flags, stamp = run("timestamp")
        tail_flags, tail = run("type", "user_id", "app_id", "cluster_id")
        flags = head_flags | middle_flags | stamp_flags | tail_flags | _MESSAGE_ID_FLAG
        return cls(flags, head, middle, stamp if stamp_flags else None, tail)

    def seal(self, headers: bytes | None, message_id: str, now: int) -> SealedProperties:
        """These properties with ``headers`` (an encoded field table, length included; None
        for no headers property), ``message_id`` and, unless fixed, the timestamp ``now``
        (epoch seconds): the bytes :meth:`AmqpProperties.encode` gives for the same values.
        Raises FieldTableError for a message_id that is no short string, or a ``now`` that
        is no timestamp."""
        out = bytearray(self.head)
        flags = self.flags | _TIMESTAMP_FLAG
        if headers is not None:
            flags |= _HEADERS_FLAG
            out += headers
        out += self.middle
        _short(out, message_id, "message_id")
        if self.timestamp is not None:
            out += self.timestamp
        else:
            _timestamp(out, now)
        out += self.tail
        return SealedProperties(_PACK_H(flags) + out)


def _timestamp(out: bytearray, value: Any) -> None:
    """Append the timestamp property ``value`` (epoch seconds, 64 bits unsigned); raises
    FieldTableError for anything else (a bool included)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
        raise FieldTableError(f"property timestamp must be a non-negative integer: {value!r}")
    out += _PACK_Q(value)


def _short(out: bytearray, value: Any, name: str) -> None:
    if isinstance(value, str):
        try:
            raw = value.encode()
        except UnicodeEncodeError as e:
            raise FieldTableError(f"property {name} is not valid Unicode: {e.reason}") from e
    elif isinstance(value, bytes):
        raw = value
    else:
        raise FieldTableError(f"property {name} must be a str, not {type(value).__name__}")
    if len(raw) > 255:
        raise FieldTableError(f"property {name} is longer than 255 bytes")
    out.append(len(raw))
    out += raw


def _octet(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise FieldTableError(f"property {name} must be an integer 0..255: {value!r}")
    return int(value)


def install() -> None:
    """Make pika decode every content header of the process with :class:`AmqpProperties`."""
    pika.spec.props[pika.spec.BasicProperties.INDEX] = AmqpProperties


install()
