"""Message properties on the wire, with :mod:`amqp_lab.fieldtable`'s lossless header codec.

pika decodes every content header with ``pika.spec.props[60]`` (BasicProperties). Its header
codec truncates floats to ints and raises OverflowError on a timestamp past year 9999, inside
the frame decoder: the connection dies, the broker redelivers the message to the next consumer,
and that one dies too (checked on pika 1.4.4 against RabbitMQ 3.10 and 4.0). Importing this
module (:mod:`amqp_lab.connection` does) registers :class:`AmqpProperties` there instead, for the
whole process: same attributes and behaviour as pika's class, every header value decoded, and a
table that still cannot be decoded kept as raw bytes in ``undecodable_headers`` (with
``headers`` None) rather than raising. The consumer dead-letters such a delivery as a business
error instead of losing its connection.
"""

from __future__ import annotations

import struct
from typing import Any

import pika.spec

from amqp_lab.fieldtable import FieldTableError, decode_table, encode_table

__all__ = ["AmqpProperties", "install"]

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
        """The encoded properties as a new list (pika inserts the frame header into it)."""
        if self._sealed is not None:
            return [self._sealed]
        flags = 0
        body = bytearray()
        for bit, (name, kind) in enumerate(_FIELDS):
            value = getattr(self, name)
            if value is None:
                continue
            flags |= 1 << (15 - bit)
            if kind == "s":
                raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
                if len(raw) > 255:
                    raise FieldTableError(f"property {name} is longer than 255 bytes")
                body.append(len(raw))
                body += raw
            elif kind == "F":
                body += encode_table(value)
            elif kind == "o":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
                    raise FieldTableError(f"property {name} must be an integer 0..255: {value!r}")
                body.append(value)
            else:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise FieldTableError(f"property {name} must be a non-negative integer")
                try:
                    body += struct.pack(">Q", value)
                except struct.error as e:
                    raise FieldTableError(f"property {name} does not fit 64 bits") from e
        return [struct.pack(">H", flags), bytes(body)]

    def decode(self, encoded: bytes, offset: int = 0) -> AmqpProperties:
        (flags,) = struct.unpack_from(">H", encoded, offset)
        offset += 2
        word = flags
        while word & 1:  # continuation flag words: AMQP 0-9-1 defines no property there
            (word,) = struct.unpack_from(">H", encoded, offset)
            offset += 2
        for bit, (name, kind) in enumerate(_FIELDS):
            value: Any = None
            if flags & (1 << (15 - bit)):
                if kind == "s":
                    length = encoded[offset]
                    raw = bytes(encoded[offset + 1 : offset + 1 + length])
                    offset += 1 + length
                    try:
                        value = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        value = raw
                elif kind == "F":
                    value, offset = self._decode_headers(encoded, offset)
                elif kind == "o":
                    value = encoded[offset]
                    offset += 1
                else:
                    (value,) = struct.unpack_from(">Q", encoded, offset)
                    offset += 8
            setattr(self, name, value)
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


def install() -> None:
    """Make pika decode every content header of the process with :class:`AmqpProperties`."""
    pika.spec.props[pika.spec.BasicProperties.INDEX] = AmqpProperties


install()
