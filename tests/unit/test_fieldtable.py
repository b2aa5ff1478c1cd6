"""The lossless field-table codec and the properties class pika decodes with."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab import wire
from amqp_lab.fieldtable import (
    FieldTableError,
    TaggedBytes,
    TaggedFloat,
    TaggedInt,
    decode_table,
    encode_table,
)
from amqp_lab.typed_fields import from_typed, table_from_typed, to_typed, typed_table
from tests.amqp_values import field_tables, field_values, same

pytestmark = pytest.mark.unit


def raw_table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def key(name: bytes) -> bytes:
    return bytes([len(name)]) + name


# --- what pika 1.4 gets wrong, and this codec does not -----------------------------------------
def test_pika_truncates_floats_we_do_not() -> None:
    table = raw_table(key(b"f") + b"d" + struct.pack(">d", 1.5))
    assert pika.data.decode_table(table, 0)[0] == {"f": 1}  # the loss, shown
    assert decode_table(table)[0] == {"f": 1.5}


def test_pika_cannot_encode_a_float_we_can() -> None:
    with pytest.raises(pika.exceptions.UnsupportedAMQPFieldException):
        pika.data.encode_table([], {"f": 1.5})
    assert decode_table(encode_table({"f": 1.5}))[0] == {"f": 1.5}


def test_a_timestamp_past_year_9999_crashes_pika_not_us() -> None:
    """RabbitMQ accepts it from any publisher; pika's frame decoder then raises and the
    connection dies on every delivery of that message."""
    table = raw_table(key(b"t") + b"T" + struct.pack(">Q", 2**63))
    with pytest.raises(OverflowError):
        pika.data.decode_table(table, 0)
    value = decode_table(table)[0]["t"]
    assert (type(value), int(value), value.tag) == (TaggedInt, 2**63, "T")
    assert encode_table({"t": value}) == table


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (b"b" + struct.pack(">b", -5), TaggedInt(-5, "b")),
        (b"B" + struct.pack(">B", 200), TaggedInt(200, "B")),
        (b"s" + struct.pack(">h", -300), TaggedInt(-300, "s")),
        (b"u" + struct.pack(">H", 60000), TaggedInt(60000, "u")),
        (b"I" + struct.pack(">i", 7), 7),
        (b"i" + struct.pack(">I", 7), TaggedInt(7, "i")),
        (b"l" + struct.pack(">q", 7), TaggedInt(7, "l")),
        (b"l" + struct.pack(">q", 2**40), 2**40),
        (b"f" + struct.pack(">f", 2.5), TaggedFloat(2.5)),
        (b"D" + struct.pack(">Bi", 2, 150), Decimal("1.50")),
        (b"S" + struct.pack(">I", 2) + b"\xff\xfe", TaggedBytes(b"\xff\xfe")),
        (b"x" + struct.pack(">I", 2) + b"ab", b"ab"),
        (b"T" + struct.pack(">Q", 0), datetime(1970, 1, 1, tzinfo=UTC)),
        (b"V", None),
    ],
)
def test_every_wire_type_decodes_and_re_encodes_to_the_same_bytes(
    entry: bytes, expected: Any
) -> None:
    table = raw_table(key(b"k") + entry)
    value = decode_table(table)[0]["k"]
    assert same(value, expected)
    assert encode_table({"k": value}) == table


def test_plain_values_encode_as_pika_does() -> None:
    headers = {"s": "x", "n": 5, "big": 2**40, "t": True, "list": [1, "a"], "none": None}
    pieces: list[bytes] = []
    pika.data.encode_table(pieces, headers)
    assert encode_table(headers) == b"".join(pieces)


def test_unknown_field_type_is_an_error_not_a_crash() -> None:
    with pytest.raises(FieldTableError, match="unknown field type"):
        decode_table(raw_table(key(b"z") + b"Z\x00\x00\x00\x01"))


@pytest.mark.parametrize(
    "table",
    [
        struct.pack(">I", 50) + b"\x01k",  # longer than the data
        raw_table(key(b"k") + b"S" + struct.pack(">I", 10) + b"abc"),  # string cut short
        raw_table(key(b"k") + b"I"),  # integer cut short
    ],
)
def test_a_truncated_table_is_an_error(table: bytes) -> None:
    with pytest.raises(FieldTableError):
        decode_table(table)


def test_nesting_past_the_limit_is_refused_both_ways() -> None:
    value: Any = 1
    for _ in range(150):
        value = [value]
    with pytest.raises(FieldTableError, match="nested deeper"):
        encode_table({"deep": value})
    nested = b"V"
    for _ in range(150):
        nested = b"A" + struct.pack(">I", len(nested)) + nested
    with pytest.raises(FieldTableError, match="nested deeper"):
        decode_table(raw_table(key(b"deep") + nested))


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"a": {1, 2}}, r"headers\['a'\]: set is not an AMQP field type"),
        ({"a": [1, object()]}, r"headers\['a'\]\[1\]: object is not"),
        ({"n": 2**64}, "does not fit AMQP type 'l'"),
        ({"n": TaggedInt(300, "b")}, "does not fit AMQP type 'b'"),
        ({"d": Decimal("1e-300")}, "scale <= 255"),
        ({"d": Decimal("NaN")}, "not a finite decimal"),
        ({"t": datetime(1960, 1, 1, tzinfo=UTC)}, "before 1970"),
        ({"k" * 256: 1}, "longer than 255 bytes"),
        ({"f": TaggedFloat(1e300)}, "32-bit float"),
        ({"f": float("nan")}, "nan is not a number RabbitMQ accepts"),
        ({"f": [float("-inf")]}, r"headers\['f'\]\[0\]: -inf is not a number RabbitMQ accepts"),
    ],
)
def test_values_amqp_cannot_carry_are_named(headers: dict[str, Any], message: str) -> None:
    with pytest.raises(FieldTableError, match=message):
        encode_table(headers)


@settings(database=None, max_examples=300)
@given(table=field_tables)
def test_wire_round_trip_is_type_and_byte_exact(table: dict[str, Any]) -> None:
    encoded = encode_table(table)
    decoded, end = decode_table(encoded)
    assert end == len(encoded)
    assert same(decoded, table)
    assert encode_table(decoded) == encoded


@settings(database=None, max_examples=300)
@given(value=field_values)
def test_typed_json_round_trip_is_type_and_byte_exact(value: Any) -> None:
    typed = json.loads(json.dumps(to_typed(value), allow_nan=False))
    back = from_typed(typed)
    assert same(back, value)
    assert encode_table({"v": back}) == encode_table({"v": value})


def test_typed_form_reads_as_documented() -> None:
    table = {
        "a": "x",
        "n": 5,
        "b": b"\x00",
        "list": [TaggedInt(1, "b"), None],
        "d": Decimal("1.50"),
    }
    assert typed_table(table) == [
        ["a", {"S": "x"}],
        ["n", {"I": 5}],
        ["b", {"x": "AA=="}],
        ["list", {"A": [{"b": 1}, {"V": None}]}],
        ["d", {"D": "1.50"}],
    ]
    assert same(table_from_typed(typed_table(table)), table)


def test_non_finite_floats_keep_their_bits_in_json() -> None:
    assert to_typed(float("-inf")) == {"d": "0xfff0000000000000"}
    assert from_typed({"d": "0xfff0000000000000"}) == float("-inf")


@pytest.mark.parametrize("typed", [{"S": "a", "I": 1}, {"Q": 1}, "x", {"x": "!!"}, {"F": [1]}])
def test_malformed_typed_values_are_errors(typed: Any) -> None:
    with pytest.raises(FieldTableError):
        from_typed(typed)


# --- the properties class pika decodes with ----------------------------------------------------
def test_pika_decodes_content_headers_with_our_class() -> None:
    assert pika.spec.props[pika.spec.BasicProperties.INDEX] is wire.AmqpProperties


def test_properties_round_trip_every_field() -> None:
    props = wire.AmqpProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"f": 1.5, "t": TaggedInt(2**63, "T")},
        delivery_mode=2,
        priority=7,
        correlation_id="c",
        reply_to="r",
        expiration="100",
        message_id="m",
        timestamp=1700000000,
        type="t",
        user_id="u",
        app_id="a",
        cluster_id="x",
    )
    encoded = b"".join(props.encode())
    back = wire.AmqpProperties().decode(encoded)
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "message_id"):
        assert getattr(back, name) == getattr(props, name)
    assert (back.timestamp, back.app_id, back.cluster_id) == (1700000000, "a", "x")
    assert same(back.headers, props.headers)
    assert b"".join(back.encode()) == encoded


_PLAIN_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "content_type": st.text(max_size=20),
    "content_encoding": st.text(max_size=20),
    "headers": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "delivery_mode": st.integers(0, 255),
    "priority": st.integers(0, 255),
    "correlation_id": st.text(max_size=20),
    "reply_to": st.text(max_size=20),
    "expiration": st.text(max_size=20),
    "message_id": st.text(max_size=20),
    "timestamp": st.integers(0, 2**63 - 1),
    "type": st.text(max_size=20),
    "user_id": st.text(max_size=20),
    "app_id": st.text(max_size=20),
    "cluster_id": st.text(max_size=20),
}


@settings(max_examples=300)
@given(st.fixed_dictionaries({}, optional=_PLAIN_VALUES))
def test_any_set_of_properties_decodes_as_pika_decodes_it(kwargs: dict[str, Any]) -> None:
    """Whichever properties a content header carries (the decoder visits only those its flags
    set), every property reads as pika's own decoder reads it, and the absent ones are None."""
    encoded = b"".join(pika.BasicProperties(**kwargs).encode())
    ours, theirs = wire.AmqpProperties().decode(encoded), pika.BasicProperties().decode(encoded)
    for name in _PLAIN_VALUES:
        assert getattr(ours, name) == getattr(theirs, name) == kwargs.get(name), name


def test_properties_encode_like_pika() -> None:
    kwargs = {"content_type": "x", "headers": {"a": "b"}, "message_id": "m", "delivery_mode": 2}
    assert b"".join(wire.AmqpProperties(**kwargs).encode()) == b"".join(
        pika.BasicProperties(**kwargs).encode()
    )


def test_undecodable_headers_are_kept_raw_and_the_rest_decodes() -> None:
    bad = raw_table(key(b"z") + b"Z\x00")
    encoded = (
        struct.pack(">H", (1 << 13) | (1 << 7)) + bad + bytes([1]) + b"m"  # headers, message_id
    )
    props = wire.AmqpProperties().decode(encoded)
    assert props.headers is None
    assert props.undecodable_headers == bad
    assert props.header_error is not None and "unknown field type" in props.header_error
    assert props.message_id == "m"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"priority": 256}, "priority must be an integer 0..255"),
        ({"message_id": "m" * 256}, "message_id is longer than 255 bytes"),
        ({"headers": {"s": {1}}}, "set is not an AMQP field type"),
        ({"timestamp": -1}, "timestamp must be a non-negative integer"),
    ],
)
def test_properties_refuse_what_amqp_cannot_carry(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(FieldTableError, match=message):
        wire.AmqpProperties(**kwargs).encode()


def test_sealed_properties_are_encoded_once() -> None:
    props = wire.AmqpProperties(message_id="m").seal()
    first = props.encode()
    props.message_id = "changed"  # a sealed object keeps its bytes
    assert props.encode() == first


def test_sealed_properties_survive_pika_framing_them_twice() -> None:
    """pika inserts the frame header into the list encode() returns: a republish must not see
    the first one's header."""
    props = wire.AmqpProperties(message_id="m", headers={"a": 1}).seal()
    frames = [pika.frame.Header(1, 10, props).marshal() for _ in range(2)]
    assert (
        frames[0]
        == frames[1]
        == pika.frame.Header(1, 10, wire.AmqpProperties(message_id="m", headers={"a": 1})).marshal()
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"correlation_id": 5}, "correlation_id must be a str, not int"),
        ({"message_id": "\udcff"}, "message_id is not valid Unicode"),
        ({"headers": {"k": "\udcff"}}, "not valid Unicode"),
        ({"headers": {"\udcff": 1}}, "not valid Unicode"),
    ],
)
def test_non_strings_and_lone_surrogates_are_refused_not_mangled(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(FieldTableError, match=message):
        wire.AmqpProperties(**kwargs).encode()


def test_a_decimal_decodes_exactly_whatever_the_decimal_context() -> None:
    import decimal

    table = raw_table(key(b"d") + b"D" + struct.pack(">Bi", 2, 1234567890))
    with decimal.localcontext(decimal.Context(prec=5)):
        value = decode_table(table)[0]["d"]
    assert str(value) == "12345678.90"
    assert encode_table({"d": value}) == table
