"""What the DLQ console shows (pure): typed header rows, payload text, x-death rows, ages, the
error page for a broker error, and the rate field.

Everything here returns plain text; the templates escape it (Jinja autoescape), since a
payload or a header is whatever a publisher sent.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from amqp_lab.dlq.record import utc_iso
from amqp_lab.dlq.summary import parse_time
from amqp_lab.dlq.view import DlqEntry
from amqp_lab.errors import (
    AccessRefused,
    AmqpLabError,
    AuthenticationFailed,
    BrokerConnectionError,
    ConfigurationError,
    NotFound,
    VhostAccessDenied,
)
from amqp_lab.settings import mask_url
from amqp_lab.typed_fields import typed_table

__all__ = [
    "MAX_PAYLOAD_CHARS",
    "MAX_RATE",
    "TYPE_NAMES",
    "ErrorPage",
    "FieldRow",
    "age",
    "death_rows",
    "error_page",
    "field_rows",
    "payload_text",
    "rate_from",
    "short_time",
]

MAX_PAYLOAD_CHARS = 100_000
"""A payload longer than this is shown cut (the record keeps all of it)."""
MAX_RATE = 10_000.0
"""The highest replay rate the form accepts, messages per second."""

TYPE_NAMES = {
    "S": "long string",
    "Sb": "long string, not UTF-8",
    "x": "byte array",
    "t": "boolean",
    "b": "signed 8-bit",
    "B": "unsigned 8-bit",
    "s": "signed 16-bit",
    "u": "unsigned 16-bit",
    "I": "signed 32-bit",
    "i": "unsigned 32-bit",
    "l": "signed 64-bit",
    "L": "signed 64-bit (L)",
    "f": "float",
    "d": "double",
    "D": "decimal",
    "T": "timestamp",
    "F": "table",
    "A": "array",
    "V": "void",
}
"""AMQP 0-9-1 field type tags (docs/dlq-record.md) and what they are."""


@dataclass(frozen=True)
class FieldRow:
    """One header or property: its key, AMQP type tag and name, and its value as text."""

    key: str
    tag: str
    type_name: str
    value: str


def field_rows(table: dict[Any, Any]) -> list[FieldRow]:
    """``table`` (headers or properties as a DlqEntry holds them) as rows in wire order, with
    each value's AMQP type visible. A value that has no AMQP type shows as one ``?`` row."""
    try:
        pairs = typed_table(table)
    except Exception as e:  # a value no encoder knows: show it rather than fail the page
        return [FieldRow("?", "?", "not encodable", f"{type(e).__name__}: {e}")]
    rows = []
    for key, typed in pairs:
        ((tag, value),) = typed.items()
        name = key if isinstance(key, str) else f"{key['x']} (key bytes, base64)"
        rows.append(FieldRow(name, tag, TYPE_NAMES.get(tag, "?"), _typed_text(tag, value)))
    return rows


def _typed_text(tag: str, value: Any) -> str:
    if tag in ("S", "D"):  # a decimal's string keeps its exponent: "1.50"
        return str(value)
    if tag in ("x", "Sb"):
        return f"{value} (base64)"
    if tag == "T" and isinstance(value, int):
        try:
            return f"{value} ({utc_iso(value)})"
        except (OverflowError, OSError, ValueError):
            return str(value)
    if tag in ("F", "A"):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return json.dumps(value, ensure_ascii=False)


def payload_text(entry: DlqEntry) -> tuple[str, str]:
    """(text, note): the payload as a person reads it - JSON indented, text as it is, other
    bytes as base64 - cut at :data:`MAX_PAYLOAD_CHARS`; the note says which and how big."""
    if entry.payload_encoding == "json":
        text = json.dumps(entry.payload, indent=2, ensure_ascii=False)
        note = "JSON"
    elif entry.payload_encoding == "base64":
        text = str(entry.payload)
        size = len(base64.b64decode(text)) if _is_base64(text) else len(text)
        note = f"binary, {size} bytes, shown as base64"
    else:
        text = str(entry.payload)
        note = "text"
    if len(text) > MAX_PAYLOAD_CHARS:
        note += f"; first {MAX_PAYLOAD_CHARS:,} of {len(text):,} characters shown"
        text = text[:MAX_PAYLOAD_CHARS]
    return text, note


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        return False
    return True


def death_rows(x_death: list[Any] | None) -> list[list[tuple[str, str]]]:
    """The broker's x-death array (most recent death first) as (field, text) rows per death."""
    rows = []
    for death in x_death or []:
        if isinstance(death, dict):
            rows.append([(_plain(k), _plain(v)) for k, v in death.items()])
        else:
            rows.append([("?", _plain(death))])
    return rows


def _plain(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value)
    return str(value)


def short_time(value: str | None) -> str:
    """An ISO 8601 time as ``2026-12-01 09:10:04 UTC`` (to the second); ``-`` when unknown;
    a time that does not parse as it is."""
    try:
        then = parse_time(value)
    except (ValueError, TypeError):
        return str(value)
    if then is None:
        return "-"
    if then.tzinfo is None:
        return then.strftime("%Y-%m-%d %H:%M:%S")
    return then.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(value: str | None, now: datetime) -> str:
    """How long before ``now`` (aware) an ISO 8601 time was: ``42 s``, ``5 min``, ``3 h``,
    ``2 d``; empty when unknown or unreadable."""
    try:
        then = parse_time(value)
    except (ValueError, TypeError):
        return ""
    if then is None or then.tzinfo is None:
        return ""
    seconds = max(0.0, (now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{math.floor(seconds / size)} {unit}"
    return f"{math.floor(seconds)} s"


@dataclass(frozen=True)
class ErrorPage:
    """An HTTP status, a title and one line of explanation (masked)."""

    status: int
    title: str
    message: str


def error_page(error: AmqpLabError, *, queue: str, vhost: str) -> ErrorPage:
    """The page for a broker error: 404 when the DLQ does not exist, 503 when the broker
    cannot be reached, 502 when it refused the console's user (or answered otherwise badly).
    The message names the DLQ and vhost, never a password."""
    text = mask_url(str(error))
    if isinstance(error, NotFound):
        return ErrorPage(
            404,
            "DLQ not found",
            f"the DLQ {queue!r} does not exist in vhost {vhost!r} (apply the topology, or "
            f"start the console with the right --topology / --queue): {text}",
        )
    if isinstance(error, AuthenticationFailed | VhostAccessDenied):
        return ErrorPage(502, "the broker refused the console's user", text)
    if isinstance(error, AccessRefused):
        return ErrorPage(
            502,
            "the broker refused an operation",
            f"the console's user lacks a permission on {queue!r} or on the exchange a replay "
            f"publishes to (docs/console.md lists what it needs): {text}",
        )
    if isinstance(error, ConfigurationError):
        return ErrorPage(500, "configuration error", text)
    if isinstance(error, BrokerConnectionError):
        return ErrorPage(503, "broker unavailable", text)
    return ErrorPage(502, "the broker answered with an error", text)


def rate_from(text: str | None) -> float | None:
    """The replay rate field: messages per second, None for no limit (an empty field).
    Raises ValueError unless it is a number in (0, :data:`MAX_RATE`]."""
    if text is None or not text.strip():
        return None
    rate = float(text)
    if not math.isfinite(rate) or not 0 < rate <= MAX_RATE:
        raise ValueError(f"the rate must be more than 0 and at most {MAX_RATE:g} messages/s")
    return rate
