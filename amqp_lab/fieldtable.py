"""AMQP 0-9-1 field tables, losslessly (pure): the wire codec and a typed JSON form.

pika 1.4's own codec loses data and can crash a consumer (checked on 1.4.4):

* ``f`` and ``d`` (float, double) decode as **int**: a header of 1.5 arrives as 1, and pika
  cannot encode a float at all;
* a ``T`` timestamp beyond year 9999 raises OverflowError inside the frame decoder, which kills
  the connection - every consumer that receives the message dies in turn, and RabbitMQ accepts
  such a header from any publisher;
* every integer is re-encoded as ``l`` and a ``S`` long string that is not UTF-8 as ``x``, so a
  republished copy does not carry the bytes it arrived with; a Decimal is normalized
  (``1.50`` becomes ``1.5``).

This codec decodes every type RabbitMQ accepts (https://www.rabbitmq.com/docs/amqp-0-9-1-errata,
"Field types"; RabbitMQ refuses unknown types at publish with 541 INTERNAL_ERROR) and re-encodes a
decoded table to the same bytes. Where Python's type alone would lose the wire type, the value is
a subclass that still behaves as the plain type (``TaggedInt`` is an ``int``). A plain int
travels as ``I`` when it fits 32 bits and as ``l`` otherwise, as pika sends it, so the common
case decodes to a plain int:

=====  ==================  =========================================================
tag    AMQP type           Python value
=====  ==================  =========================================================
t      boolean             bool
b B    (un)signed 8-bit    TaggedInt(tag)
s u    (un)signed 16-bit   TaggedInt(tag)
I i    (un)signed 32-bit   int for ``I``; TaggedInt("i")
l L    signed 64-bit       int for ``l`` beyond 32 bits; else TaggedInt(tag)
f      float               TaggedFloat - plain ``float`` encodes as ``d``
d      double              float
D      decimal             Decimal, its exponent kept (``1.50`` stays ``1.50``)
T      timestamp (s)       aware UTC datetime; TaggedInt("T") beyond datetime's range
S      long string         str; TaggedBytes when not UTF-8
x      byte array          bytes
A      array               list
F      table               dict (keys str, or bytes when not UTF-8)
V      void                None
=====  ==================  =========================================================

The JSON form that keeps every value and its tag (DLQ records) is
:mod:`amqp_lab.typed_fields`. Limits, documented: a table with a key twice keeps the last value
(as a dict must), and a boolean octet other than 0/1 comes back as 1.
"""

from __future__ import annotations

import math
import struct
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "INT_TAGS",
    "MAX_DEPTH",
    "FieldTableError",
    "TaggedBytes",
    "TaggedFloat",
    "TaggedInt",
    "decode_table",
    "default_int_tag",
    "encode_table",
    "epoch_seconds",
    "tagged_int",
]

INT_TAGS: dict[bytes, tuple[str, int]] = {  # tag -> (struct format, size)
    b"b": (">b", 1),
    b"B": (">B", 1),
    b"s": (">h", 2),
    b"u": (">H", 2),
    b"I": (">i", 4),
    b"i": (">I", 4),
    b"l": (">q", 8),
    b"L": (">q", 8),
    b"T": (">Q", 8),
}
MAX_DEPTH = 100
"""Nesting accepted on decode and encode; deeper is refused, never a crash."""
_PACK_I, _UNPACK_I = struct.Struct(">I").pack, struct.Struct(">I").unpack_from
_PACK_i, _UNPACK_i = struct.Struct(">i").pack, struct.Struct(">i").unpack_from


class FieldTableError(ValueError):
    """A value AMQP cannot carry, or bytes that are not a field table. ``str(e)`` names the
    header path, e.g. ``headers['a'][2]: set is not an AMQP field type``."""


class TaggedInt(int):
    """An int that remembers its AMQP wire type (``tag``: one of b B s u I i l L T). pika also
    knows ``U``; RabbitMQ refuses it at publish (541 INTERNAL_ERROR, checked on 3.10 and 4.0),
    so it is no type here."""

    tag: str

    def __new__(cls, value: int, tag: str) -> TaggedInt:
        if tag.encode() not in INT_TAGS:
            raise FieldTableError(f"{tag!r} is not an AMQP integer type")
        self = super().__new__(cls, value)
        self.tag = tag
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaggedInt, (int(self), self.tag))


class TaggedFloat(float):
    """A float that travels as AMQP ``f`` (32-bit); a plain float travels as ``d``."""

    tag = "f"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaggedFloat, (float(self),))


class TaggedBytes(bytes):
    """An AMQP ``S`` long string whose bytes are not UTF-8 (plain bytes travel as ``x``)."""

    tag = "S"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaggedBytes, (bytes(self),))


# --- wire: decode --------------------------------------------------------------------------------
def decode_table(encoded: bytes, offset: int = 0) -> tuple[dict[Any, Any], int]:
    """Decode the field table at ``offset``; return (table, offset after it). Raises
    FieldTableError for an unknown type or a table cut short (never another exception)."""
    try:
        return _decode_table(bytes(encoded), offset, 0)
    except FieldTableError:
        raise
    except (struct.error, IndexError, ValueError, InvalidOperation) as e:
        raise FieldTableError(f"malformed field table: {e}") from e


def _decode_table(buf: bytes, offset: int, depth: int) -> tuple[dict[Any, Any], int]:
    if depth > MAX_DEPTH:
        raise FieldTableError(f"field table nested deeper than {MAX_DEPTH}")
    (size,) = struct.unpack_from(">I", buf, offset)
    offset += 4
    end = offset + size
    if end > len(buf):
        raise FieldTableError("field table longer than its frame")
    table: dict[Any, Any] = {}
    while offset < end:
        key, offset = _short_string(buf, offset)
        table[key], offset = _decode_value(buf, offset, depth)
    if offset != end:
        raise FieldTableError("field table size does not match its contents")
    return table, offset


def _short_string(buf: bytes, offset: int) -> tuple[str | bytes, int]:
    length = buf[offset]
    raw = buf[offset + 1 : offset + 1 + length]
    if len(raw) != length:
        raise FieldTableError("short string cut short")
    try:
        return raw.decode("utf-8"), offset + 1 + length
    except UnicodeDecodeError:
        return raw, offset + 1 + length


def _decode_value(buf: bytes, offset: int, depth: int) -> tuple[Any, int]:
    tag = buf[offset : offset + 1]
    offset += 1
    if tag == b"S":  # the common cases first: this runs for every header of every delivery
        (length,) = _UNPACK_I(buf, offset)
        offset += 4
        data = buf[offset : offset + length]
        if len(data) != length:
            raise FieldTableError("string cut short")
        try:
            return data.decode("utf-8"), offset + length
        except UnicodeDecodeError:
            return TaggedBytes(data), offset + length
    if tag == b"I":
        return _UNPACK_i(buf, offset)[0], offset + 4
    if tag in INT_TAGS:
        return _decode_int(tag, buf, offset)
    if tag == b"t":
        return buf[offset] != 0, offset + 1
    if tag == b"f":
        return TaggedFloat(struct.unpack_from(">f", buf, offset)[0]), offset + 4
    if tag == b"d":
        return struct.unpack_from(">d", buf, offset)[0], offset + 8
    if tag == b"D":
        scale = buf[offset]
        (raw,) = struct.unpack_from(">i", buf, offset + 1)
        digits = tuple(int(c) for c in str(abs(raw)))
        return Decimal((int(raw < 0), digits, -scale)), offset + 5  # exact: no context rounding
    if tag == b"x":
        (length,) = _UNPACK_I(buf, offset)
        offset += 4
        data = buf[offset : offset + length]
        if len(data) != length:
            raise FieldTableError("byte array cut short")
        return data, offset + length
    if tag == b"A":
        return _decode_array(buf, offset, depth)
    if tag == b"F":
        return _decode_table(buf, offset, depth + 1)
    if tag == b"V":
        return None, offset
    raise FieldTableError(f"unknown field type {tag!r}")


def _decode_int(tag: bytes, buf: bytes, offset: int) -> tuple[Any, int]:
    """An integer type (``T`` too: an aware datetime, TaggedInt beyond datetime's range)."""
    fmt, size = INT_TAGS[tag]
    (number,) = struct.unpack_from(fmt, buf, offset)
    offset += size
    if tag == b"T":
        try:
            return datetime.fromtimestamp(number, UTC), offset
        except (OverflowError, OSError, ValueError):
            return TaggedInt(number, "T"), offset
    return tagged_int(number, tag.decode()), offset


def _decode_array(buf: bytes, offset: int, depth: int) -> tuple[list[Any], int]:
    if depth >= MAX_DEPTH:
        raise FieldTableError(f"field array nested deeper than {MAX_DEPTH}")
    (length,) = struct.unpack_from(">I", buf, offset)
    offset += 4
    end = offset + length
    items = []
    while offset < end:
        item, offset = _decode_value(buf, offset, depth + 1)
        items.append(item)
    if offset != end:
        raise FieldTableError("field array size does not match its contents")
    return items, offset


# --- wire: encode --------------------------------------------------------------------------------
def encode_table(table: dict[Any, Any] | None, path: str = "headers") -> bytes:
    """The wire bytes of ``table`` (size prefix included). Raises FieldTableError naming the
    path of a value AMQP cannot carry: an unsupported type, an int outside signed 64 bits (or
    outside its tag's range), a Decimal with more than 255 decimals or an unscaled value outside
    32 bits, a timestamp before 1970, a key longer than 255 bytes, a NaN or an infinity
    (RabbitMQ answers those with 541 INTERNAL_ERROR and closes the connection: checked on
    3.10.8 and 4.0.5)."""
    out = bytearray()
    try:
        _encode_table(out, table or {}, path, 0)
    except UnicodeEncodeError as e:  # a lone surrogate in a key or a string
        raise FieldTableError(f"{path}: a string is not valid Unicode ({e.reason})") from e
    return bytes(out)


def _encode_table(out: bytearray, table: dict[Any, Any], path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise FieldTableError(f"{path}: nested deeper than {MAX_DEPTH}")
    start = len(out)
    out += b"\0\0\0\0"
    for key, value in table.items():
        if isinstance(key, str):
            raw = key.encode("utf-8")
        elif isinstance(key, bytes):
            raw = key
        else:
            raise FieldTableError(f"{path}: key {key!r} must be a str")
        if len(raw) > 255:
            raise FieldTableError(f"{path}: key {key[:40]!r}... is longer than 255 bytes")
        out.append(len(raw))
        out += raw
        _encode_value(out, value, f"{path}[{key!r}]", depth)
    struct.pack_into(">I", out, start, len(out) - start - 4)


def _encode_value(out: bytearray, value: Any, path: str, depth: int) -> None:
    kind = type(value)
    if kind is str:  # the common cases first: this runs for every header of every message
        raw = value.encode("utf-8", "strict")
        out += b"S" + _PACK_I(len(raw)) + raw
    elif kind is int and -(2**31) <= value < 2**31:
        out += b"I" + _PACK_i(value)
    elif isinstance(value, bool):
        out += b"t\x01" if value else b"t\x00"
    elif isinstance(value, int):
        tag = value.tag if isinstance(value, TaggedInt) else default_int_tag(value)
        fmt, _ = INT_TAGS[tag.encode()]
        try:
            out += tag.encode() + struct.pack(fmt, value)
        except struct.error as e:
            raise FieldTableError(f"{path}: {int(value)} does not fit AMQP type {tag!r}") from e
    elif isinstance(value, float):
        if not math.isfinite(value):  # RabbitMQ closes the whole connection (541) on these
            raise FieldTableError(f"{path}: {value} is not a number RabbitMQ accepts")
        if isinstance(value, TaggedFloat):
            try:
                out += b"f" + struct.pack(">f", value)
            except (OverflowError, struct.error) as e:
                raise FieldTableError(f"{path}: {value} does not fit a 32-bit float") from e
        else:
            out += b"d" + struct.pack(">d", value)
    elif isinstance(value, Decimal):
        out += b"D" + _decimal(value, path)
    elif isinstance(value, datetime):
        seconds = epoch_seconds(value)
        if seconds < 0:
            raise FieldTableError(f"{path}: timestamp {value} is before 1970")
        out += b"T" + struct.pack(">Q", seconds)
    elif isinstance(value, TaggedBytes):
        out += b"S" + struct.pack(">I", len(value)) + value
    elif isinstance(value, str):
        raw = value.encode("utf-8", "strict")
        out += b"S" + struct.pack(">I", len(raw)) + raw
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        out += b"x" + struct.pack(">I", len(raw)) + raw
    elif isinstance(value, dict):
        out += b"F"
        _encode_table(out, value, path, depth + 1)
    elif isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            raise FieldTableError(f"{path}: nested deeper than {MAX_DEPTH}")
        out += b"A\0\0\0\0"
        start = len(out)
        for i, item in enumerate(value):
            _encode_value(out, item, f"{path}[{i}]", depth + 1)
        struct.pack_into(">I", out, start - 4, len(out) - start)
    elif value is None:
        out += b"V"
    else:
        raise FieldTableError(f"{path}: {type(value).__name__} is not an AMQP field type")


def default_int_tag(value: int) -> str:
    """The tag a plain int travels as: ``I`` within signed 32 bits, else ``l`` (as pika)."""
    return "I" if -(2**31) <= value < 2**31 else "l"


def tagged_int(value: int, tag: str) -> int:
    """A plain int when ``tag`` is the one it would travel as anyway, else a TaggedInt."""
    return value if tag == default_int_tag(value) else TaggedInt(value, tag)


def _decimal(value: Decimal, path: str) -> bytes:
    if not value.is_finite():
        raise FieldTableError(f"{path}: {value} is not a finite decimal")
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    if exponent > 0:
        unscaled, exponent = unscaled * 10**exponent, 0
    scale = -exponent
    if scale > 255 or not -(2**31) <= unscaled < 2**31:
        raise FieldTableError(
            f"{path}: decimal {value} needs a scale <= 255 and an unscaled value within 32 bits"
        )
    return struct.pack(">Bi", scale, unscaled)


def epoch_seconds(value: datetime) -> int:
    """Whole seconds since the epoch (a naive datetime taken as UTC), as ``T`` carries."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return math.floor(aware.timestamp())
