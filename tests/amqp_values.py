"""Hypothesis strategies for AMQP 0-9-1 field values of every type RabbitMQ accepts, and an
exact comparison (same types, same values, NaN equal to NaN) for round-trip tests."""

from __future__ import annotations

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
