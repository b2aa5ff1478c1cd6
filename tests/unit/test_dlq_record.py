"""DLQ records: build (format 2, typed headers), encode/decode payloads exactly, read DLQ
messages, rebuild replays that keep every header, property and body byte."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab.dlq.record import (
    MAX_PAYLOAD_DEPTH,
    RECORD_TYPE,
    bounded_traceback,
    build_record,
    decode_payload,
    encode_payload,
    fallback_record,
    json_depth,
    record_message,
    utc_iso,
)
from amqp_lab.dlq.view import DlqEntry, replay_message, view_of
from amqp_lab.errors import BusinessError
from amqp_lab.fieldtable import encode_table
from amqp_lab.message import (
    BOOKKEEPING_HEADERS,
    BROKER_HEADERS,
    JSON,
    REPLAYED_PROPERTIES,
    OutgoingMessage,
    encode_json,
)
from amqp_lab.wire import AmqpProperties
from tests.amqp_values import field_tables, same

pytestmark = pytest.mark.unit

BODY = b'{"kind":"resize","seq":7}'
FAILED_AT = datetime(2026, 11, 29, 17, 41, 2, 123000, tzinfo=UTC).timestamp()
FIRST_SEEN_AT = "2026-11-29T17:40:00.000Z"
DEATH_TIME = datetime(2026, 11, 29, 17, 41, 2, tzinfo=UTC)
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _record(**overrides: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "body": BODY,
        "message_id": "m-7",
        "exchange": "tasks",
        "routing_key": "task",
        "queue": "q:tasks",
        "properties": {"content_type": JSON, "priority": 4},
        "headers": {"attempts": 1, "trace": b"t-7"},
        "error": BusinessError("size must be positive"),
        "classification": "business",
        "attempts": 2,
        "first_seen_at": FIRST_SEEN_AT,
        "failed_at": FAILED_AT,
    }
    arguments.update(overrides)
    return build_record(**arguments)


def _props(**fields: Any) -> SimpleNamespace:
    """A delivery's properties as pika hands them over."""
    names = ("message_id", "type", "headers", *REPLAYED_PROPERTIES)
    return SimpleNamespace(**{name: fields.get(name) for name in names})


def _x_death_headers(as_bytes: bool) -> dict[str, Any]:
    """Headers of a message moved by the DLX, as pika delivers them."""

    def s(text: str) -> str | bytes:
        return text.encode() if as_bytes else text

    return {
        "x-death": [
            {
                "count": 1,
                "reason": s("rejected"),
                "queue": s("q:tasks"),
                "time": DEATH_TIME,
                "exchange": s("tasks"),
                "routing-keys": [s("task")],
            }
        ],
        "x-first-death-exchange": s("tasks"),
        "x-first-death-queue": s("q:tasks"),
        "x-first-death-reason": s("rejected"),
        "x-last-death-exchange": s("tasks"),
        "x-last-death-queue": s("q:tasks"),
        "x-last-death-reason": s("rejected"),
        "trace": s("t-9"),
    }


# --- utc_iso -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ts", "iso"),
    [(0, "1970-01-01T00:00:00.000Z"), (FAILED_AT, "2026-11-29T17:41:02.123Z")],
)
def test_utc_iso(ts: float, iso: str) -> None:
    assert utc_iso(ts) == iso


# --- build_record ----------------------------------------------------------------------------
def test_build_record() -> None:
    assert _record() == {
        "format": 2,
        "message_id": "m-7",
        "payload": {"kind": "resize", "seq": 7},
        "payload_encoding": "json",
        "content_type": "application/json",
        "properties": [["content_type", {"S": "application/json"}], ["priority", {"I": 4}]],
        "error": {"type": "BusinessError", "message": "size must be positive"},
        "classification": "business",
        "attempts": 2,
        "first_seen_at": FIRST_SEEN_AT,
        "last_failed_at": "2026-11-29T17:41:02.123Z",
        "original": {"exchange": "tasks", "routing_key": "task", "queue": "q:tasks"},
        "headers": [["trace", {"x": "dC03"}]],
    }


def test_record_last_failed_at_is_iso_8601_utc_with_z() -> None:
    assert ISO_UTC.fullmatch(_record()["last_failed_at"])


def test_record_is_json_serialisable() -> None:
    record = _record(headers={"d": Decimal("1.5"), "t": DEATH_TIME, "n": [b"\xff", {"a": 1.5}]})
    assert json.loads(encode_json(record)) == record


def test_record_error_message_is_truncated_to_2000_characters() -> None:
    record = _record(error=RuntimeError("x" * 5000))
    assert record["error"] == {"type": "RuntimeError", "message": "x" * 2000}


def test_an_unknown_exception_carries_a_bounded_traceback() -> None:
    def buggy() -> None:
        raise ZeroDivisionError("division by zero in buggy()")

    try:
        buggy()
    except ZeroDivisionError as e:
        error = e
    trace = _record(error=error, classification="unknown")["error"]["traceback"]
    assert "in buggy" in trace
    assert trace.endswith("ZeroDivisionError: division by zero in buggy()\n")
    assert "traceback" not in _record()["error"]  # a business error needs none


def test_a_long_traceback_keeps_its_end() -> None:
    try:
        raise RuntimeError("y" * 20_000)
    except RuntimeError as e:
        trace = bounded_traceback(e, limit=500)
    assert len(trace) == 500
    assert trace.startswith("...\n") and trace.endswith("y\n")


def test_record_drops_broker_and_bookkeeping_headers_and_keeps_x_death_apart() -> None:
    headers = _x_death_headers(as_bytes=True) | {"attempts": 1, "x-request-id": "r-1"}
    record = _record(headers=headers)
    assert record["headers"] == [["trace", {"x": "dC05"}], ["x-request-id", {"S": "r-1"}]]
    assert record["x_death"]["A"][0]["F"][0] == ["count", {"I": 1}]


def test_record_names_the_original_destination_after_retry_hops() -> None:
    """A retry comes back through tasks.retry with the wait queue's routing key; the record
    names where the message was first published."""
    headers = {"original_exchange": "tasks", "original_routing_key": "task", "attempts": 3}
    record = _record(exchange="tasks.retry", routing_key="q:tasks:wait:3", headers=headers)
    assert record["original"] == {"exchange": "tasks", "routing_key": "task", "queue": "q:tasks"}
    assert record["headers"] == []


def test_record_keeps_undecodable_headers_raw() -> None:
    record = _record(headers=None, undecodable_headers=b"\x00\x00\x00\x02\x01z")
    assert record["headers_raw"] == "AAAAAgF6"


def test_record_of_a_non_utf8_body_is_base64() -> None:
    record = _record(body=b"\xff\x00\xfe")
    assert (record["payload"], record["payload_encoding"]) == ("/wD+", "base64")


def test_record_message_carries_the_record_to_the_dlx() -> None:
    record = _record()
    assert record_message(record, "tasks.dlx", "task") == OutgoingMessage(
        body=encode_json(record),
        message_id="m-7",
        exchange="tasks.dlx",
        routing_key="task",
        content_type=JSON,
        headers={"attempts": 2},
        persistent=True,
        type="dlq-record",
    )


def test_the_record_and_its_header_agree_on_attempts() -> None:
    """The delivery said attempts=1 (one retry already settled); the record counts deliveries
    tried (2), and the DLQ message's own header says the same."""
    record = _record()
    message = record_message(record, "tasks.dlx", "task")
    assert record["attempts"] == message.headers["attempts"] == 2
    assert all(key != "attempts" for key, _ in record["headers"])


def test_fallback_record_keeps_the_exact_body() -> None:
    record = fallback_record(
        body=b"\x00raw", message_id="m-1", queue="q:tasks", error=ValueError("v"), problem="p"
    )
    entry = view_of(record_message(record, "tasks.dlx", "task").body, _props(type=RECORD_TYPE))
    assert decode_payload(entry.payload, entry.payload_encoding) == b"\x00raw"
    assert (entry.error_type, record["record_error"]) == ("ValueError", "p")


# --- encode_payload / decode_payload -----------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "payload", "encoding"),
    [
        (b'{"kind":"a"}', {"kind": "a"}, "json"),
        (b"[1,2]", [1, 2], "json"),
        (b"hello", "hello", "text"),
        ("größe".encode(), "größe", "text"),
        (b"", "", "text"),
        (b"\xff\xfe", "//4=", "base64"),
    ],
)
def test_encode_payload(body: bytes, payload: Any, encoding: str) -> None:
    assert encode_payload(body) == (payload, encoding)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@settings(database=None)
@given(value=json_values)
def test_json_payload_round_trips(value: Any) -> None:
    body = encode_json(value)
    payload, encoding = encode_payload(body)
    assert encoding == "json"
    assert decode_payload(payload, encoding) == body


@settings(database=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8")).filter(lambda t: not _is_json(t)))
def test_text_payload_round_trips(text: str) -> None:
    body = text.encode("utf-8")
    payload, encoding = encode_payload(body)
    # readable text unless its JSON escapes would take more than three times its size
    assert (payload, encoding) in ((text, "text"), (base64.b64encode(body).decode(), "base64"))
    assert decode_payload(payload, encoding) == body
    assert encoding == "base64" or len(json.dumps(payload)) <= 3 * len(body) + 2


@settings(database=None)
@given(body=st.binary(max_size=2000))
def test_a_payload_takes_at_most_three_times_its_body_in_a_strict_json_record(
    body: bytes,
) -> None:
    """The size bound of the issue: raw or base64 bytes, never unbounded JSON escapes (a body
    of zeros once grew six times)."""
    payload, encoding = encode_payload(body)
    size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=True, allow_nan=False))
    assert size <= 3 * len(body) + 4
    assert decode_payload(payload, encoding) == body


def test_a_body_of_control_characters_goes_as_base64() -> None:
    assert encode_payload(b"\x00" * 1000) == (base64.b64encode(b"\x00" * 1000).decode(), "base64")


@settings(database=None)
@given(parts=st.tuples(st.binary(), st.binary()))
def test_non_utf8_payload_round_trips(parts: tuple[bytes, bytes]) -> None:
    body = parts[0] + b"\xff" + parts[1]  # 0xFF never occurs in UTF-8
    payload, encoding = encode_payload(body)
    assert encoding == "base64"
    assert decode_payload(payload, encoding) == body


# --- view_of -----------------------------------------------------------------------------------
def test_view_of_a_record_message() -> None:
    msg = record_message(_record(), "tasks.dlx", "task")
    entry = view_of(msg.body, _props(message_id=msg.message_id, type=msg.type))
    assert entry == DlqEntry(
        message_id="m-7",
        source="record",
        error_type="BusinessError",
        error_message="size must be positive",
        classification="business",
        attempts=2,
        first_seen_at=FIRST_SEEN_AT,
        last_failed_at="2026-11-29T17:41:02.123Z",
        exchange="tasks",
        routing_key="task",
        payload={"kind": "resize", "seq": 7},
        payload_encoding="json",
        headers={"trace": b"t-7"},
        properties={"content_type": JSON, "priority": 4},
        queue="q:tasks",
    )


@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes-values", "str-values"])
def test_view_of_a_raw_message_with_x_death(as_bytes: bool) -> None:
    headers = _x_death_headers(as_bytes=as_bytes)
    entry = view_of(
        b'{"kind":"resize","seq":9}', _props(message_id="m-9", headers=headers, priority=3)
    )
    assert entry == DlqEntry(
        message_id="m-9",
        source="x-death",
        error_type="dead-lettered:rejected",
        error_message="rejected from queue q:tasks",
        classification="rejected",
        attempts=None,
        first_seen_at=None,
        last_failed_at="2026-11-29T17:41:02.000Z",
        exchange="tasks",
        routing_key="task",
        payload={"kind": "resize", "seq": 9},
        payload_encoding="json",
        headers=headers,
        properties={"priority": 3},
        queue="q:tasks",
        x_death=headers["x-death"],
    )


def test_view_of_a_raw_message_treats_a_naive_death_time_as_utc() -> None:
    headers = _x_death_headers(as_bytes=True)
    headers["x-death"][0]["time"] = datetime(2026, 11, 29, 17, 41, 2)
    assert view_of(BODY, _props(headers=headers)).last_failed_at == "2026-11-29T17:41:02.000Z"


def test_view_of_a_raw_message_does_not_take_x_death_count_for_attempts() -> None:
    headers = _x_death_headers(as_bytes=True)
    headers["x-death"][0]["count"] = 3
    assert view_of(BODY, _props(headers=headers)).attempts is None


def test_view_of_a_raw_message_takes_attempts_from_our_header() -> None:
    headers = _x_death_headers(as_bytes=True) | {"attempts": 4}
    assert view_of(BODY, _props(headers=headers)).attempts == 4


def test_view_of_a_raw_message_prefers_our_first_seen_header() -> None:
    headers = _x_death_headers(as_bytes=False) | {"first_seen_at": FIRST_SEEN_AT}
    assert view_of(BODY, _props(headers=headers)).first_seen_at == FIRST_SEEN_AT


def test_view_of_a_raw_message_prefers_our_original_destination() -> None:
    headers = _x_death_headers(as_bytes=False) | {
        "original_exchange": "orders",
        "original_routing_key": "order.created",
    }
    entry = view_of(BODY, _props(headers=headers))
    assert (entry.exchange, entry.routing_key) == ("orders", "order.created")


def test_view_of_a_format_1_record() -> None:
    record = {
        "message_id": "m-1",
        "payload": {"kind": "a"},
        "payload_encoding": "json",
        "content_type": JSON,
        "error": {"type": "RuntimeError", "message": "boom"},
        "classification": "transient",
        "attempts": 2,
        "original": {"exchange": "tasks", "routing_key": "task", "queue": "q:tasks"},
        "headers": {"trace": "t-1", "attempts": 1},
    }
    entry = view_of(encode_json(record), _props(type=RECORD_TYPE))
    assert entry.headers == {"trace": "t-1", "attempts": 1}
    assert entry.properties == {"content_type": JSON}
    assert replay_message(entry).headers == {"trace": "t-1", "attempts": 0}


def test_view_of_a_message_without_x_death() -> None:
    assert view_of(b"plain text", _props(message_id="m-1")) == DlqEntry(
        message_id="m-1",
        source="raw",
        error_type="dead-lettered:unknown",
        error_message="",
        classification="?",
        attempts=None,
        first_seen_at=None,
        last_failed_at=None,
        exchange="",
        routing_key="",
        payload="plain text",
        payload_encoding="text",
        headers={},
    )


def test_view_of_a_damaged_record_shows_it_raw() -> None:
    props = _props(message_id="m-3", type=RECORD_TYPE, headers={"attempts": 2})
    entry = view_of(b'{"message_id": "m-3"}', props)
    assert (entry.source, entry.payload, entry.attempts) == ("raw", '{"message_id": "m-3"}', 2)


def test_entry_as_dict_is_json_and_lossless() -> None:
    msg = record_message(_record(), "tasks.dlx", "task")
    assert view_of(msg.body, _props(type=msg.type)).as_dict() == {
        "message_id": "m-7",
        "source": "record",
        "error": {"type": "BusinessError", "message": "size must be positive"},
        "classification": "business",
        "attempts": 2,
        "first_seen_at": FIRST_SEEN_AT,
        "last_failed_at": "2026-11-29T17:41:02.123Z",
        "original": {"exchange": "tasks", "routing_key": "task"},
        "payload": {"kind": "resize", "seq": 7},
        "payload_encoding": "json",
        "headers": [["trace", {"x": "dC03"}]],
        "properties": [["content_type", {"S": JSON}], ["priority", {"I": 4}]],
        "traceback": None,
    }


# --- replay_message ----------------------------------------------------------------------------
def _entry(**overrides: Any) -> DlqEntry:
    fields: dict[str, Any] = {
        "message_id": "m-5",
        "source": "x-death",
        "error_type": "dead-lettered:rejected",
        "error_message": "rejected from queue q:tasks",
        "classification": "rejected",
        "attempts": 3,
        "first_seen_at": FIRST_SEEN_AT,
        "last_failed_at": FIRST_SEEN_AT,
        "exchange": "tasks",
        "routing_key": "task",
        "payload": {"kind": "resize", "seq": 5},
        "payload_encoding": "json",
        "headers": {
            "attempts": 3,
            "trace": "t-5",
            "x-death": [{"count": 1, "reason": "rejected"}],
            "x-first-death-queue": "q:tasks",
            "x-first-death-reason": "rejected",
            "x-last-death-queue": "q:tasks",
            "x-last-death-reason": "rejected",
            "first_seen_at": FIRST_SEEN_AT,
            "original_exchange": "tasks",
            "original_routing_key": "task",
        },
        "properties": {"content_type": JSON},
    }
    fields.update(overrides)
    return DlqEntry(**fields)


def test_replay_message_rebuilds_the_original() -> None:
    assert replay_message(_entry()) == OutgoingMessage(
        body=b'{"kind":"resize","seq":5}',
        message_id="m-5",
        exchange="tasks",
        routing_key="task",
        content_type=JSON,
        headers={"trace": "t-5", "attempts": 0},
    )


def test_replay_message_resets_attempts_and_drops_broker_and_bookkeeping_headers() -> None:
    assert replay_message(_entry()).headers == {"trace": "t-5", "attempts": 0}


def test_replay_message_exchange_override() -> None:
    assert replay_message(_entry(), exchange="tasks.retry").exchange == "tasks.retry"


def test_replay_message_keeps_the_default_exchange() -> None:
    replay = replay_message(_entry(exchange="", routing_key="q:direct"))
    assert (replay.exchange, replay.routing_key) == ("", "q:direct")


def test_replay_message_keeps_the_original_properties() -> None:
    props = {
        "content_type": "text/plain",
        "content_encoding": "gzip",
        "correlation_id": "c-1",
        "reply_to": "amq.rabbitmq.reply-to",
        "priority": 9,
        "type": "invoice",
        "app_id": "billing",
        "timestamp": 1700000000,
    }
    replay = replay_message(_entry(properties=props))
    assert {name: getattr(replay, name) for name in props} == props


def test_replay_message_of_a_binary_payload() -> None:
    replay = replay_message(
        _entry(payload="/wD+", payload_encoding="base64", properties={"content_type": "x/y"})
    )
    assert (replay.body, replay.content_type) == (b"\xff\x00\xfe", "x/y")


def test_replay_of_a_record_message_restores_the_original_message() -> None:
    msg = record_message(_record(), "tasks.dlx", "task")
    replay = replay_message(view_of(msg.body, _props(message_id=msg.message_id, type=msg.type)))
    assert replay == OutgoingMessage(
        body=BODY,
        message_id="m-7",
        exchange="tasks",
        routing_key="task",
        content_type=JSON,
        headers={"trace": b"t-7", "attempts": 0},
        priority=4,
    )


@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes-values", "str-values"])
def test_replay_of_a_raw_x_death_message_restores_the_original_message(as_bytes: bool) -> None:
    headers = _x_death_headers(as_bytes=as_bytes) | {"attempts": 0}
    replay = replay_message(
        view_of(BODY, _props(message_id="m-7", headers=headers, content_type=JSON))
    )
    assert replay == OutgoingMessage(
        body=BODY,
        message_id="m-7",
        exchange="tasks",
        routing_key="task",
        content_type=JSON,
        headers={"trace": b"t-9" if as_bytes else "t-9", "attempts": 0},
    )


@settings(database=None, max_examples=200, deadline=None)
@given(headers=field_tables, body=st.binary(max_size=64))
def test_dlq_record_and_replay_keep_every_header_and_the_body_exact(
    headers: dict[str, Any], body: bytes
) -> None:
    """Delivery -> DLQ record (JSON on the wire) -> view -> replay -> properties on the wire:
    every header comes back with the same type and the same bytes; only our bookkeeping and
    the broker's x-death family are reset."""
    headers = {k: v for k, v in headers.items() if k not in BOOKKEEPING_HEADERS | BROKER_HEADERS}
    message = record_message(_record(body=body, headers=headers), "tasks.dlx", "task")
    entry = view_of(message.body, _props(message_id=message.message_id, type=message.type))
    replay = replay_message(entry)
    wire_props = AmqpProperties().decode(b"".join(replay.sealed_properties().encode()))
    assert replay.body == body
    replayed = dict(wire_props.headers)
    assert replayed.pop("attempts") == 0
    assert same(replayed, headers)
    assert encode_table(replayed) == encode_table(headers)


# --- poison bodies: nesting that would exhaust the recursion limit ------------------------------
@pytest.mark.parametrize(
    ("value", "depth"),
    [(1, 0), ("x", 0), ([], 1), ({"a": [1, {"b": []}]}, 4), ([[1], [[2]]], 3)],
)
def test_json_depth(value: Any, depth: int) -> None:
    assert json_depth(value) == depth


def test_json_depth_of_a_very_deep_value_does_not_recurse() -> None:
    value: Any = []
    for _ in range(50_000):
        value = [value]
    assert json_depth(value) == 50_001


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 5000,  # not JSON, but the parser recurses before it finds out (hypothesis found it)
        b"[" * 500 + b"]" * 500,  # valid JSON, too deep to keep as JSON in a record
        b'{"a":' * (MAX_PAYLOAD_DEPTH + 1) + b"1" + b"}" * (MAX_PAYLOAD_DEPTH + 1),
    ],
)
def test_deeply_nested_bodies_are_kept_as_text_and_replay_byte_for_byte(body: bytes) -> None:
    payload, encoding = encode_payload(body)
    assert (payload, encoding) == (body.decode(), "text")
    record = _record(body=body)
    assert json.loads(record_message(record, "tasks.dlx", "task").body)["payload"] == body.decode()
    assert decode_payload(payload, encoding) == body


def test_json_at_the_depth_limit_stays_json() -> None:
    body = b"[" * MAX_PAYLOAD_DEPTH + b"]" * MAX_PAYLOAD_DEPTH
    assert encode_payload(body)[1] == "json"


@pytest.mark.parametrize("body", [b"[" * 5000, b"[1,2]", b'"a string"', b"{nope"])
def test_a_damaged_record_is_shown_raw(body: bytes) -> None:
    entry = view_of(body, _props(message_id="m-1", type=RECORD_TYPE, headers={}))
    assert entry.source == "raw"
    assert decode_payload(entry.payload, entry.payload_encoding) == body


def test_a_content_type_that_is_not_utf8_still_makes_a_record() -> None:
    """A short string may be any bytes: a foreign publisher's content_type b'\\x00\\xb3\\xff'
    once made the record's JSON fail, and the worker with it, on every redelivery
    (test_hostile_readers found it). The record keeps it exactly in its typed properties."""
    content_type = b"\x00\xb3\xff"
    record = _record(properties={"content_type": content_type, "priority": 4})
    assert record["content_type"] is None
    message = record_message(record, "tasks.dlx", "task")  # JSON: it used to raise here
    entry = view_of(message.body, _props(type=RECORD_TYPE))
    assert entry.source == "record"
    assert entry.properties["content_type"] == content_type
