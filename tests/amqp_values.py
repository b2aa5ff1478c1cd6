"""Hypothesis strategies for AMQP 0-9-1 field values of every type RabbitMQ accepts, and an
exact comparison (same types, same values, NaN equal to NaN) for round-trip tests."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from amqp_lab.fieldtable import TaggedBytes, TaggedFloat, TaggedInt, tagged_int

_RANGES = {
    "b": (-(2**7), 2**7 - 1),
    "B": (0, 2**8 - 1),
    "s": (-(2**15), 2**15 - 1),
    "u": (0, 2**16 - 1),
    "I": (-(2**31), 2**31 - 1),
    "i": (0, 2**32 - 1),
    "l": (-(2**63), 2**63 - 1),
    "L": (-(2**63), 2**63 - 1),
}


def _tagged_int(tag: str) -> st.SearchStrategy[int]:
    low, high = _RANGES[tag]
    return st.integers(low, high).map(lambda n: tagged_int(n, tag))


def _float32() -> st.SearchStrategy[float]:
    return st.floats(width=32, allow_nan=False, allow_infinity=False).map(TaggedFloat)


def _decimal() -> st.SearchStrategy[Decimal]:
    return st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(0, 12)).map(
        lambda pair: Decimal(pair[0]).scaleb(-pair[1])
    )


def _invalid_utf8() -> st.SearchStrategy[bytes]:
    return st.tuples(st.binary(max_size=8), st.binary(max_size=8)).map(
        lambda parts: TaggedBytes(parts[0] + b"\xff" + parts[1])
    )


scalars: st.SearchStrategy[Any] = st.one_of(
    st.text(max_size=20),
    _invalid_utf8(),
    st.binary(max_size=20),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from(sorted(_RANGES)).flatmap(_tagged_int),
    st.floats(allow_nan=False, allow_infinity=False),  # RabbitMQ refuses NaN and infinities
    _float32(),
    _decimal(),
    st.integers(0, 253402300799).map(lambda s: datetime.fromtimestamp(s, UTC)),
    st.integers(253402300800, 2**64 - 1).map(lambda s: TaggedInt(s, "T")),
    st.none(),
)

keys = st.text(max_size=12).filter(lambda k: len(k.encode()) <= 255 and k not in ("CC", "BCC"))
"""Header names; not CC/BCC, which RabbitMQ reads as sender-selected routing."""

field_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=16,
)
field_tables: st.SearchStrategy[dict[str, Any]] = st.dictionaries(keys, field_values, max_size=6)


def same(a: Any, b: Any) -> bool:
    """Equal values of the very same types, recursively; NaN equals NaN (same sign)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b) and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, TaggedInt):
        return a.tag == b.tag and int(a) == int(b)
    if isinstance(a, Decimal):
        return bool(a.as_tuple() == b.as_tuple())
    return bool(a == b)


# --- what a foreign publisher can send ------------------------------------------------------------
LINE_BREAKERS = ("\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029")
hostile_texts: st.SearchStrategy[str] = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "x\nmessage_id=forged outcome=processed attempts=1 redelivered=false",
            "a\rb",
            "a\u2028b\u2029c",
            "a\x85b",
            "\x1b[31mred\x1b[0m",
            "\x00\x07\t\x7f\x9f",
            "dlq-record",
            "",
        ]
    ),
    st.tuples(st.text(max_size=6), st.sampled_from(LINE_BREAKERS), st.text(max_size=6)).map(
        "".join
    ),
)
"""Text with line breaks and control characters, as a publisher may put in any string."""

short_strings: st.SearchStrategy[str | bytes] = st.one_of(
    hostile_texts.filter(lambda t: len(t.encode()) <= 255),
    st.binary(min_size=1, max_size=12).map(lambda b: b + b"\xff"),  # a short string not UTF-8
)
"""AMQP short strings (properties): text, or bytes that are not UTF-8."""

SPECIAL_HEADERS = (
    "x-death",
    "attempts",
    "first_seen_at",
    "original_exchange",
    "original_routing_key",
    "key",
    "traceparent",
    "tracestate",
    "x-first-death-queue",
)
"""Header names amqp-lab or RabbitMQ give a meaning to: a publisher may send them too."""

_death = st.dictionaries(
    st.sampled_from(["count", "reason", "queue", "time", "exchange", "routing-keys", "other"]),
    field_values,
    max_size=6,
)
hostile_tables: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    st.one_of(keys, st.sampled_from(SPECIAL_HEADERS)),
    st.one_of(field_values, st.lists(_death, max_size=2), hostile_texts),
    max_size=6,
)
"""Header tables with random values, under random names and the names with a meaning."""

_TIMESTAMPS = st.one_of(
    st.integers(0, 253402300799),  # within datetime's range
    st.integers(253402300800, 2**64 - 1),  # beyond year 9999: legal, and a past crash
)

foreign_properties: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {},
    optional={
        "content_type": st.sampled_from(["application/json", "text/plain"]) | short_strings,
        "content_encoding": short_strings,
        "headers": hostile_tables,
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 255),
        "correlation_id": short_strings,
        "reply_to": short_strings,
        "expiration": st.sampled_from(["3600000", "86400000"]),  # long enough to be read
        "message_id": short_strings,
        "timestamp": _TIMESTAMPS,
        "type": st.one_of(st.just("dlq-record"), short_strings),
        "app_id": short_strings,
    },
)
"""basic.publish properties a foreign publisher may send and RabbitMQ accepts: every field but
``user_id`` (RabbitMQ refuses one other than the connection's user) and ``cluster_id``, with
``expiration`` long enough for the test to read the message."""

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["\ud800", "a\udcffb", "\n\u2028"]),  # JSON escapes a lone surrogate
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
"""JSON values as Python's json module writes them: NaN, Infinity and lone surrogates (as
``\\ud800`` escapes) included."""

RECORD_FIELDS = (
    "format",
    "message_id",
    "payload",
    "payload_encoding",
    "content_type",
    "properties",
    "headers",
    "error",
    "classification",
    "attempts",
    "first_seen_at",
    "last_failed_at",
    "original",
    "x_death",
)
fake_records: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    st.sampled_from(RECORD_FIELDS),
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"type": json_values, "message": json_values},
            optional={"traceback": json_values},
        ),
        st.fixed_dictionaries(
            {"exchange": json_values, "routing_key": json_values},
            optional={"queue": json_values},
        ),
        st.sampled_from(["json", "text", "base64", 2, 1]),
    ),
    max_size=len(RECORD_FIELDS),
)
"""Bodies shaped like DLQ records (docs/dlq-record.md), every field of any JSON type."""

foreign_bodies: st.SearchStrategy[bytes] = st.one_of(
    st.binary(max_size=40),
    json_values.map(lambda v: json.dumps(v).encode()),
    fake_records.map(lambda r: json.dumps(r).encode()),
    st.sampled_from([b"", b"NaN", b'{"x": Infinity}', b"[" * 3000, b'"\\ud800"']),
)
"""Message bodies: bytes, JSON (with NaN and Infinity), record look-alikes, poison."""
