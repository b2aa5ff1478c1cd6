"""The typed JSON form of AMQP field values (pure): every value with its wire type and bytes,
so a DLQ record keeps a header exactly (docs/dlq-record.md) - the JSON side of
:mod:`amqp_lab.fieldtable`, whose module docstring lists the types.

:func:`to_typed` / :func:`from_typed` give and read it for one value: ``{"S": "text"}``,
``{"I": 5}``, ``{"x": "<base64>"}``, ``{"Sb": "<base64>"}`` (a long string that is not UTF-8),
``{"d": "0x7ff8..."}`` (a NaN or an infinity as its IEEE bits), ``{"F": [["key", {...}],
...]}``; :func:`typed_table` / :func:`table_from_typed` for a whole table, in wire order.
"""

from __future__ import annotations

import base64
import math
import struct
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from amqp_lab.fieldtable import (
    INT_TAGS,
    MAX_DEPTH,
    FieldTableError,
    TaggedBytes,
    TaggedFloat,
    TaggedInt,
    default_int_tag,
    epoch_seconds,
    tagged_int,
)

__all__ = ["from_typed", "table_from_typed", "to_typed", "typed_table"]


def to_typed(value: Any) -> Any:
    """A JSON-safe form of one field value that keeps its type and bytes (see the module doc).
    Raises FieldTableError for a value AMQP cannot carry."""
    return _to_typed(value, "value", 0)


def _to_typed(value: Any, path: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise FieldTableError(f"{path}: nested deeper than {MAX_DEPTH}")
    if isinstance(value, bool):
        return {"t": value}
    if isinstance(value, int):
        tag = value.tag if isinstance(value, TaggedInt) else default_int_tag(value)
        return {tag: int(value)}
    if isinstance(value, float):
        tag = "f" if isinstance(value, TaggedFloat) else "d"
        if math.isfinite(value):
            return {tag: float(value)}
        # NaN and infinities as their IEEE bits: JSON has no such numbers, and a NaN's sign
        # and payload would be lost in a name
        return {tag: "0x" + struct.pack(">f" if tag == "f" else ">d", value).hex()}
    if isinstance(value, Decimal):
        return {"D": str(value)}
    if isinstance(value, datetime):
        return {"T": epoch_seconds(value)}
    if isinstance(value, TaggedBytes):
        return {"Sb": base64.b64encode(value).decode("ascii")}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"x": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {"F": typed_table(value, path, depth + 1)}
    if isinstance(value, list | tuple):
        return {"A": [_to_typed(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]}
    if value is None:
        return {"V": None}
    raise FieldTableError(f"{path}: {type(value).__name__} is not an AMQP field type")


def typed_table(table: dict[Any, Any], path: str = "headers", depth: int = 0) -> list[Any]:
    """A table as ``[[key, typed value], ...]`` in wire order; a key that is not UTF-8 is
    ``{"x": "<base64>"}``."""
    return [
        [
            key if isinstance(key, str) else {"x": base64.b64encode(key).decode("ascii")},
            _to_typed(value, f"{path}[{key!r}]", depth),
        ]
        for key, value in table.items()
    ]


def table_from_typed(pairs: list[Any]) -> dict[Any, Any]:
    """Inverse of :func:`typed_table`. Raises FieldTableError for a malformed form."""
    table: dict[Any, Any] = {}
    try:
        for key, typed in pairs:
            real_key = key if isinstance(key, str) else base64.b64decode(key["x"], validate=True)
            table[real_key] = from_typed(typed)
    except (TypeError, ValueError, KeyError) as e:
        raise FieldTableError(f"malformed typed table: {e}") from e
    return table


def from_typed(typed: Any) -> Any:
    """Inverse of :func:`to_typed`. Raises FieldTableError for a malformed form."""
    try:
        ((tag, value),) = typed.items()
    except (AttributeError, ValueError) as e:
        raise FieldTableError(f"malformed typed value {typed!r:.80}") from e
    try:
        if tag == "t":
            return bool(value)
        if tag == "T":
            try:
                return datetime.fromtimestamp(int(value), UTC)
            except (OverflowError, OSError, ValueError):
                return TaggedInt(int(value), "T")
        if tag.encode() in INT_TAGS:
            return tagged_int(int(value), tag)
        if tag in ("f", "d"):
            if isinstance(value, str):
                bits = bytes.fromhex(value.removeprefix("0x"))
                number = struct.unpack(">f" if tag == "f" else ">d", bits)[0]
            else:
                number = float(value)
            return TaggedFloat(number) if tag == "f" else number
        if tag == "D":
            return Decimal(value)
        if tag == "S":
            return str(value)
        if tag == "Sb":
            return TaggedBytes(base64.b64decode(value, validate=True))
        if tag == "x":
            return base64.b64decode(value, validate=True)
        if tag == "F":
            return table_from_typed(value)
        if tag == "A":
            return [from_typed(v) for v in value]
        if tag == "V":
            return None
    except (TypeError, ValueError, InvalidOperation) as e:
        raise FieldTableError(f"malformed typed value {typed!r:.80}: {e}") from e
    raise FieldTableError(f"unknown typed tag {tag!r}")
