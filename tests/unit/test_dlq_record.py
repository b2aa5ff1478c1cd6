"""DLQ records: build, encode/decode payloads, read DLQ messages, rebuild replays."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab.dlq_record import (
    MAX_PAYLOAD_DEPTH,
    RECORD_TYPE,
    DlqEntry,
    build_record,
    decode_payload,
    encode_payload,
    json_depth,
    record_message,
    replay_message,
    utc_iso,
    view_of,
)
from amqp_lab.errors import BusinessError
from amqp_lab.message import JSON, OutgoingMessage, encode_json

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
        "content_type": JSON,
        "headers": {"attempts": 1, "trace": b"t-7"},
        "error": BusinessError("size must be positive"),
        "classification": "business",
        "attempts": 2,
        "first_seen_at": FIRST_SEEN_AT,
        "failed_at": FAILED_AT,
    }
    arguments.update(overrides)
    return build_record(**arguments)


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
        "message_id": "m-7",
        "payload": {"kind": "resize", "seq": 7},
        "payload_encoding": "json",
        "content_type": "application/json",
        "error": {"type": "BusinessError", "message": "size must be positive"},
        "classification": "business",
        "attempts": 2,
        "first_seen_at": FIRST_SEEN_AT,
        "last_failed_at": "2026-11-29T17:41:02.123Z",
        "original": {"exchange": "tasks", "routing_key": "task", "queue": "q:tasks"},
        "headers": {"attempts": 1, "trace": "t-7"},
    }


def test_record_last_failed_at_is_iso_8601_utc_with_z() -> None:
    assert ISO_UTC.fullmatch(_record()["last_failed_at"])


def test_record_is_json_serialisable() -> None:
    record = _record()
    assert json.loads(encode_json(record)) == record


def test_record_error_message_is_truncated_to_2000_characters() -> None:
    record = _record(error=RuntimeError("x" * 5000))
    assert record["error"] == {"type": "RuntimeError", "message": "x" * 2000}


def test_record_drops_broker_death_headers() -> None:
    record = _record(headers=_x_death_headers(as_bytes=True) | {"attempts": 1})
    assert record["headers"] == {"trace": "t-9", "attempts": 1}


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
    assert (payload, encoding) == (text, "text")
    assert decode_payload(payload, encoding) == body


@settings(database=None)
@given(parts=st.tuples(st.binary(), st.binary()))
def test_non_utf8_payload_round_trips(parts: tuple[bytes, bytes]) -> None:
    body = parts[0] + b"\xff" + parts[1]  # 0xFF never occurs in UTF-8
    payload, encoding = encode_payload(body)
    assert encoding == "base64"
    assert decode_payload(payload, encoding) == body


def test_json_payload_is_re_encoded_compactly() -> None:
    assert decode_payload(*encode_payload(b'{ "seq": 1, "kind": "a" }')) == b'{"kind":"a","seq":1}'


# --- view_of -----------------------------------------------------------------------------------
def test_view_of_a_record_message() -> None:
    msg = record_message(_record(), "tasks.dlx", "task")
    entry = view_of(msg.body, msg.message_id, msg.type, msg.headers)
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
        headers={"attempts": 1, "trace": "t-7"},
    )


@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes-values", "str-values"])
def test_view_of_a_raw_message_with_x_death(as_bytes: bool) -> None:
    entry = view_of(b'{"kind":"resize","seq":9}', "m-9", None, _x_death_headers(as_bytes=as_bytes))
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
        headers={"trace": "t-9"},
    )


def test_view_of_a_raw_message_treats_a_naive_death_time_as_utc() -> None:
    headers = _x_death_headers(as_bytes=True)
    headers["x-death"][0]["time"] = datetime(2026, 11, 29, 17, 41, 2)
    assert view_of(BODY, "m-9", None, headers).last_failed_at == "2026-11-29T17:41:02.000Z"


def test_view_of_a_raw_message_does_not_take_x_death_count_for_attempts() -> None:
    headers = _x_death_headers(as_bytes=True)
    headers["x-death"][0]["count"] = 3
    assert view_of(BODY, "m-9", None, headers).attempts is None


def test_view_of_a_raw_message_takes_attempts_from_our_header() -> None:
    headers = _x_death_headers(as_bytes=True) | {"attempts": 4}
    assert view_of(BODY, "m-9", None, headers).attempts == 4


def test_view_of_a_raw_message_prefers_our_first_seen_header() -> None:
    headers = _x_death_headers(as_bytes=False) | {"first_seen_at": FIRST_SEEN_AT}
    assert view_of(BODY, "m-9", None, headers).first_seen_at == FIRST_SEEN_AT


def test_view_of_a_message_without_x_death() -> None:
    assert view_of(b"plain text", "m-1", None, None) == DlqEntry(
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
    entry = view_of(b'{"message_id": "m-3"}', "m-3", RECORD_TYPE, {"attempts": 2})
    assert (entry.source, entry.payload, entry.attempts) == ("raw", {"message_id": "m-3"}, 2)


def test_entry_as_dict() -> None:
    msg = record_message(_record(), "tasks.dlx", "task")
    assert view_of(msg.body, msg.message_id, msg.type, msg.headers).as_dict() == {
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
        "headers": {"attempts": 1, "trace": "t-7"},
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
        },
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


def test_replay_message_resets_attempts_and_drops_broker_headers() -> None:
    assert replay_message(_entry()).headers == {"trace": "t-5", "attempts": 0}


def test_replay_message_exchange_override() -> None:
    assert replay_message(_entry(), exchange="tasks.retry").exchange == "tasks.retry"


def test_replay_message_empty_exchange_falls_back_to_tasks() -> None:
    assert replay_message(_entry(exchange="")).exchange == "tasks"


def test_replay_message_of_a_binary_payload() -> None:
    replay = replay_message(_entry(payload="/wD+", payload_encoding="base64"))
    assert (replay.body, replay.content_type) == (b"\xff\x00\xfe", "application/octet-stream")


def test_replay_of_a_record_message_restores_the_original_message() -> None:
    msg = record_message(_record(), "tasks.dlx", "task")
    replay = replay_message(view_of(msg.body, msg.message_id, msg.type, msg.headers))
    assert replay == OutgoingMessage(
        body=BODY,
        message_id="m-7",
        exchange="tasks",
        routing_key="task",
        content_type=JSON,
        headers={"attempts": 0, "trace": "t-7"},
    )


@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes-values", "str-values"])
def test_replay_of_a_raw_x_death_message_restores_the_original_message(as_bytes: bool) -> None:
    headers = _x_death_headers(as_bytes=as_bytes) | {"attempts": 0}
    replay = replay_message(view_of(BODY, "m-7", None, headers))
    assert replay == OutgoingMessage(
        body=BODY,
        message_id="m-7",
        exchange="tasks",
        routing_key="task",
        content_type=JSON,
        headers={"trace": "t-9", "attempts": 0},
    )


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
    entry = view_of(body, "m-1", RECORD_TYPE, {})
    assert entry.source == "raw"
    assert decode_payload(entry.payload, entry.payload_encoding) == body
