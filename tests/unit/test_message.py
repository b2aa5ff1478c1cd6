"""Messages as values: task_message properties, decode_body, header_attempts."""

from __future__ import annotations

import json
import re
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab import json_codec, message
from amqp_lab.errors import BusinessError, ConfigurationError, InvalidMessage, UnencodableMessage
from amqp_lab.message import (
    JSON,
    OutgoingMessage,
    decode_body,
    encode_json,
    header_attempts,
)
from amqp_lab.topology.model import Names
from lab.handler import task_message

pytestmark = pytest.mark.unit

NOW = 1795974062.75  # 2026-11-29T17:41:02.750Z


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(message, "time", SimpleNamespace(time=lambda: NOW))


# --- task_message and its properties ---------------------------------------------------------
def test_task_message_body_is_compact_sorted_json() -> None:
    assert task_message("resize", 7, "m-7").body == b'{"kind":"resize","seq":7}'


def test_task_message_routing_defaults() -> None:
    msg = task_message("resize", 7, "m-7")
    assert (msg.exchange, msg.routing_key) == ("tasks", "task")


def test_task_message_routing_overrides() -> None:
    msg = task_message("resize", 7, "m-7", exchange="other", routing_key="rk")
    assert (msg.exchange, msg.routing_key) == ("other", "rk")


@pytest.mark.usefixtures("frozen_clock")
def test_task_message_properties() -> None:
    props = task_message("resize", 7, "m-7").properties()
    assert (
        props.delivery_mode,
        props.message_id,
        props.content_type,
        props.headers,
        props.timestamp,
        props.type,
    ) == (2, "m-7", "application/json", {"attempts": 0}, 1795974062, None)


@pytest.mark.usefixtures("frozen_clock")
def test_timestamp_is_whole_seconds() -> None:
    timestamp = task_message("resize", 7, "m-7").properties().timestamp
    assert type(timestamp) is int
    assert timestamp == int(NOW)


def test_non_persistent_task_message_has_delivery_mode_1() -> None:
    assert task_message("resize", 7, "m-7", persistent=False).properties().delivery_mode == 1


def test_task_message_generates_a_uuid4_message_id() -> None:
    message_id = task_message("resize", 7).message_id
    assert uuid.UUID(message_id).version == 4
    assert str(uuid.UUID(message_id)) == message_id


def test_task_message_ids_are_unique() -> None:
    assert task_message("a", 1).message_id != task_message("a", 1).message_id


def test_explicit_timestamp_is_kept() -> None:
    msg = OutgoingMessage(body=b"{}", message_id="m", timestamp=1234567890)
    assert msg.properties().timestamp == 1234567890


def test_no_headers_means_no_header_table() -> None:
    assert OutgoingMessage(body=b"{}", message_id="m").properties().headers is None


def test_type_property_is_passed_through() -> None:
    assert OutgoingMessage(body=b"{}", message_id="m", type="dlq-record").properties().type == (
        "dlq-record"
    )


def test_properties_copy_the_headers() -> None:
    msg = OutgoingMessage(body=b"{}", message_id="m", headers={"attempts": 1})
    msg.properties().headers["attempts"] = 99
    assert msg.headers == {"attempts": 1}


def test_encode_json_is_compact_sorted_and_utf8() -> None:
    assert encode_json({"b": [1, 2], "a": "é"}) == '{"a":"é","b":[1,2]}'.encode()


# --- decode_body: accepted ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "content_type",
    [None, "", "application/json", "application/json; charset=utf-8"],
)
def test_decode_body_parses_json_content(content_type: str | None) -> None:
    assert decode_body(b'{"kind":"resize","seq":7}', content_type) == {"kind": "resize", "seq": 7}


def test_decode_body_accepts_surrounding_whitespace_and_unicode() -> None:
    assert decode_body(' {"kind": "größe"} \n'.encode(), JSON) == {"kind": "größe"}


def test_decode_body_accepts_a_body_exactly_at_the_limit() -> None:
    body = b'{"kind":"a"}'
    assert decode_body(body, JSON, max_bytes=len(body)) == {"kind": "a"}


def test_decode_body_accepts_the_task_message_body() -> None:
    msg = task_message("resize", 7, "m-7")
    assert decode_body(msg.body, msg.content_type) == {"kind": "resize", "seq": 7}


# --- decode_body: rejected, with a clear reason -------------------------------------------------
@pytest.mark.parametrize(
    ("body", "content_type", "max_bytes", "reason"),
    [
        pytest.param(b"", JSON, 100, "empty body", id="empty"),
        pytest.param(
            b'{"kind":"a"}',
            JSON,
            11,
            "body of 12 bytes exceeds the limit of 11",
            id="too-large",
        ),
        pytest.param(
            b"\xff\xfe{}",
            JSON,
            100,
            "body is not UTF-8: invalid start byte at byte 0",
            id="not-utf8",
        ),
        pytest.param(
            b'{"kind":"\xc3"}',
            JSON,
            100,
            "body is not UTF-8: invalid continuation byte at byte 9",
            id="truncated-utf8",
        ),
        pytest.param(
            b"hello",
            JSON,
            100,
            "body is not JSON: Expecting value: line 1 column 1 (char 0)",
            id="not-json",
        ),
        pytest.param(
            b'{"kind":"a"',
            JSON,
            100,
            "body is not JSON: Expecting ',' delimiter: line 1 column 12 (char 11)",
            id="truncated-json",
        ),
    ],
)
def test_decode_body_rejects_with_reason(
    body: bytes, content_type: str | None, max_bytes: int, reason: str
) -> None:
    with pytest.raises(InvalidMessage, match=f"^{re.escape(reason)}$"):
        decode_body(body, content_type, max_bytes=max_bytes)


def test_default_body_limit_is_one_mebibyte() -> None:
    body = b'{"kind":"a","pad":"' + b"x" * (1024 * 1024) + b'"}'
    with pytest.raises(
        InvalidMessage, match=rf"^body of {len(body)} bytes exceeds the limit of 1048576$"
    ):
        decode_body(body, JSON)


def test_invalid_message_is_a_business_error() -> None:
    assert issubclass(InvalidMessage, BusinessError)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)  # standard JSON has neither
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
candidate_bodies = (
    st.binary(max_size=200)
    | json_values.map(encode_json)
    | st.dictionaries(st.sampled_from(["kind", "seq", "x"]), json_values, max_size=3).map(
        encode_json
    )
)


@settings(database=None, max_examples=300)
@given(body=candidate_bodies, content_type=st.sampled_from([None, JSON, "text/plain"]))
def test_decode_body_returns_json_or_bytes_or_raises_invalid_message(
    body: bytes, content_type: str | None
) -> None:
    """No schema: a JSON content type gives the parsed value, any other the bytes."""
    try:
        value = decode_body(body, content_type)
    except InvalidMessage:
        assert content_type != "text/plain"
        return
    if content_type == "text/plain":
        assert value == body
    else:
        assert encode_json(value) == encode_json(json.loads(body))


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        ("application/octet-stream", b"\xff\x00", b"\xff\x00"),
        ("text/plain", b"hello", b"hello"),
        ("application/jsonx", b"[1]", b"[1]"),
        ("application/vnd.api+json", b"[1]", [1]),
        ("application/json", b'"a string"', "a string"),
        ("application/json", b"null", None),
    ],
)
def test_the_body_is_any_json_value_or_the_bytes(
    content_type: str, body: bytes, expected: Any
) -> None:
    assert decode_body(body, content_type) == expected


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a":' * 100_000], ids=["array", "object"])
def test_decode_body_rejects_deeply_nested_json(body: bytes) -> None:
    with pytest.raises(InvalidMessage):
        decode_body(body, JSON)


# --- header_attempts ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "attempts"),
    [(None, 0), ({}, 0), ({"trace": "t"}, 0), ({"attempts": 0}, 0), ({"attempts": 3}, 3)],
)
def test_header_attempts(headers: dict[str, Any] | None, attempts: int) -> None:
    assert header_attempts(headers) == attempts


@pytest.mark.parametrize(
    ("value", "shown"),
    [("3", "'3'"), (-1, "-1"), (True, "True"), (2.0, "2.0"), (None, "None"), (b"3", "b'3'")],
)
def test_header_attempts_rejects_non_integers(value: object, shown: str) -> None:
    reason = f"header 'attempts' must be a non-negative integer, got {shown}"
    with pytest.raises(InvalidMessage, match=f"^{re.escape(reason)}$"):
        header_attempts({"attempts": value})


def test_properties_larger_than_one_frame_are_refused_before_sending() -> None:
    """RabbitMQ closes the whole connection (501 FRAME_ERROR) on a header frame over
    frame_max; the message fails alone instead."""
    from amqp_lab.errors import UnencodableMessage
    from amqp_lab.message import MAX_PROPERTIES_BYTES

    fits = OutgoingMessage(body=b"{}", message_id="m", headers={"pad": "x" * 100_000})
    fits.sealed_properties()
    big = OutgoingMessage(body=b"{}", message_id="m", headers={"pad": "x" * MAX_PROPERTIES_BYTES})
    with pytest.raises(UnencodableMessage, match="more than one frame carries"):
        big.sealed_properties()


# --- standard JSON: publishing refuses NaN and Infinity -------------------------------------------
@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), {"a": [1, float("nan")]}]
)
def test_encode_json_refuses_nan_and_infinity_in_one_line(value: Any) -> None:
    with pytest.raises(ValueError, match="NaN or Infinity") as error:
        encode_json(value)
    assert len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize("value", ["\ud800", {"k": "a\udcffb"}, {"\udc80": 1}])
def test_encode_json_refuses_a_lone_surrogate_in_one_line(value: Any) -> None:
    with pytest.raises(ValueError, match="lone surrogate") as error:
        encode_json(value)
    assert "\\ud" in str(error.value)  # named, escaped: the line itself is printable UTF-8
    str(error.value).encode()


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}'])
def test_decode_json_refuses_what_python_accepts_beyond_the_standard(text: str) -> None:
    assert json.loads(text) is not None  # Python's parser takes it...
    with pytest.raises(ValueError, match="not a JSON number"):
        message.decode_json(text)  # ...the standard does not


def test_decode_json_reads_standard_json() -> None:
    assert message.decode_json(b'{"a": [1, 2.5e300, "\\u00e9", null]}') == {
        "a": [1, 2.5e300, "é", None]
    }


def test_message_for_refuses_a_body_standard_json_cannot_carry() -> None:
    names = Names("tasks", "task", "q:tasks", "tasks.dlx", "q:tasks:dlq")
    for body in ({"amount": float("nan")}, [float("inf")], "\ud800"):
        with pytest.raises(UnencodableMessage, match="message_id='m-1': the body is not standard"):
            message.message_for(names, body, message_id="m-1")
    assert message.message_for(names, {"a": 1.5}, message_id="m-1").body == b'{"a":1.5}'


def test_message_for_refuses_a_key_that_is_not_unicode_text() -> None:
    names = Names("tasks", "task", "q:tasks", "tasks.dlx", "q:tasks:dlq", shards=2)
    with pytest.raises(ConfigurationError, match=r"1\.\.255 bytes of UTF-8"):
        message.message_for(names, {}, key="k-\udcff")
    assert message.message_for(names, {}, key="k-1").routing_key == "k-1"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"exchange": "x" * 256}, "the exchange 'xxx"),
        ({"routing_key": "k-\ud800"}, "the routing key 'k-\\ud800' is not Unicode text"),
        ({"routing_key": "é" * 128}, "is longer than 255 bytes"),
    ],
)
def test_an_exchange_or_routing_key_that_is_no_short_string_is_refused(
    fields: dict[str, Any], reason: str
) -> None:
    """A replay of a damaged DLQ entry used to reach pika, whose failure inside basic.publish
    looked like a lost connection and was retried."""
    message = OutgoingMessage(b"{}", "m-1", **fields)
    with pytest.raises(UnencodableMessage, match="message_id='m-1'") as error:
        message.sealed_properties()
    assert reason in str(error.value)
    OutgoingMessage(b"{}", "m-1", exchange="x" * 255, routing_key="é" * 127).sealed_properties()


@pytest.mark.parametrize("body", [b"NaN", b'{"amount": Infinity}', b"[-Infinity]"])
def test_a_delivered_json_body_with_nan_or_infinity_is_invalid(body: bytes) -> None:
    """Standard JSON only, on the way in as on the way out: a foreign publisher's NaN is a
    business error, not a float the handler must guard against."""
    with pytest.raises(InvalidMessage, match=r"body is not JSON: .*is not a JSON number"):
        decode_body(body, "application/json")


_JSONISH = st.text(alphabet=' \t\r\n{}[]",:.-+0123456789eEtruefalsnNIaiy\\u\x00\x0b', max_size=30)


@settings(max_examples=1000)
@given(
    st.one_of(
        _JSONISH,
        st.text(max_size=30),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=False)
            | st.text(max_size=5),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
            max_leaves=8,
        ).map(json.dumps),
    )
)
def test_parse_json_gives_what_the_strict_decoder_gives(text: str) -> None:
    """The fast path (no whitespace scans) changes neither a value nor an error's wording."""
    try:
        expected: Any = ("value", json_codec._STRICT_JSON.decode(text))
    except ValueError as e:
        expected = ("error", str(e))
    try:
        got: Any = ("value", json_codec.parse_json(text))
    except ValueError as e:
        got = ("error", str(e))
    assert got == expected
