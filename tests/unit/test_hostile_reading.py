"""Every reader is as careful as the worker (issue 21, item 4), pure part: whatever legal
properties, headers and body a foreign publisher sends, the DLQ view, the replay it builds, the
console's presentation, fingerprints, summaries, key extraction and the stream reader's entry
give it an outcome - shown, or skipped with a reason - and never raise; their JSON is standard.
The broker part is tests/integration/test_hostile_readers.py."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab.audit.reader import StreamEntry, _entry
from amqp_lab.console.present import death_rows, field_rows, payload_text
from amqp_lab.dlq.fingerprint import fingerprint_of, group
from amqp_lab.dlq.record import (
    RECORD_TYPE,
    build_record,
    decode_payload,
    encode_record,
    record_message,
)
from amqp_lab.dlq.summary import Selection, summarize, time_of
from amqp_lab.dlq.view import DlqEntry, replay_message, view_of
from amqp_lab.errors import BusinessError, UnencodableMessage
from amqp_lab.fieldtable import TaggedFloat, TaggedInt
from amqp_lab.ordering.key_sources import keys_from_headers
from amqp_lab.wire import AmqpProperties
from tests.amqp_values import (
    RECORD_FIELDS,
    fake_records,
    field_tables,
    foreign_bodies,
    foreign_properties,
    json_values,
    same,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def strict(text: str | bytes) -> Any:
    """Parse standard JSON only: NaN, Infinity and -Infinity refused."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not standard JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def delivered(fields: dict[str, Any]) -> AmqpProperties:
    """The properties a consumer decodes after a publisher sent ``fields``: encoded and decoded
    with the lossless wire codec, as the broker passes the content header on."""
    return AmqpProperties().decode(b"".join(AmqpProperties(**fields).encode()))


def check_entry(entry: DlqEntry) -> None:
    """What every reader relies on: the field types, standard JSON, a replay that is built or
    refused with UnencodableMessage, and every presentation of it."""
    assert entry.source in ("record", "x-death", "raw", "unreadable")
    assert entry.message_id is None or isinstance(entry.message_id, str)
    for text in (entry.error_type, entry.error_message, entry.classification):
        assert isinstance(text, str)
    for text in (entry.exchange, entry.routing_key):
        assert isinstance(text, str)
    for maybe in (entry.first_seen_at, entry.last_failed_at, entry.traceback, entry.queue):
        assert maybe is None or isinstance(maybe, str)
    assert entry.attempts is None or (
        isinstance(entry.attempts, int) and not isinstance(entry.attempts, bool)
    )
    assert isinstance(decode_payload(entry.payload, entry.payload_encoding), bytes)
    text = json.dumps(entry.as_dict(), sort_keys=True, allow_nan=False)
    assert strict(text)["source"] == entry.source
    # every text is Unicode text: a page, a log line or a routing key can carry it
    json.dumps(entry.as_dict(), ensure_ascii=False, default=str).encode("utf-8")
    if entry.traceback:
        entry.traceback.encode("utf-8")
    message = replay_message(entry)
    with contextlib.suppress(UnencodableMessage):  # a replay fails with a reason, if at all
        message.sealed_properties()
    fingerprint_of(entry)
    field_rows(entry.headers)
    field_rows(entry.properties)
    payload_text(entry)
    death_rows(entry.x_death)
    time_of(entry.last_failed_at)
    Selection(since=NOW, until=NOW, key="k").matches(entry)


@settings(max_examples=300, deadline=None)
@given(fields=foreign_properties, body=foreign_bodies)
def test_view_of_reads_whatever_a_foreign_publisher_sent(
    fields: dict[str, Any], body: bytes
) -> None:
    entry = view_of(body, delivered(fields))
    check_entry(entry)
    assert entry.source != "unreadable"  # every legal value is read, not merely survived
    summary = summarize([entry, entry], NOW)
    assert summary.depth == 2
    assert len(group([entry, entry])) == 1


@settings(max_examples=300, deadline=None)
@given(record=fake_records, fields=foreign_properties)
def test_a_record_look_alike_is_shown_as_a_record_or_raw(
    record: dict[str, Any], fields: dict[str, Any]
) -> None:
    body = json.dumps(record).encode()  # NaN and Infinity included, as Python writes them
    entry = view_of(body, delivered({**fields, "type": RECORD_TYPE}))
    check_entry(entry)
    assert entry.source != "unreadable"
    if entry.source != "record":  # shown as the broker holds it
        assert decode_payload(entry.payload, entry.payload_encoding) == body


@settings(max_examples=300, deadline=None)
@given(
    where=st.sampled_from(
        [(name,) for name in RECORD_FIELDS]
        + [("error", "type"), ("error", "message"), ("error", "traceback")]
        + [("original", "exchange"), ("original", "routing_key"), ("original", "queue")]
    ),
    value=json_values,
)
def test_a_record_with_one_field_of_any_json_value_is_read(
    where: tuple[str, ...], value: Any
) -> None:
    record = _record({"h": 1})
    target = record
    for name in where[:-1]:
        target = target[name]
    target[where[-1]] = value
    body = json.dumps(record).encode()
    entry = view_of(body, _record_props())
    check_entry(entry)
    assert entry.source in ("record", "raw")
    if entry.source == "raw":
        assert decode_payload(entry.payload, entry.payload_encoding) == body


def test_a_record_with_nan_is_shown_raw_not_parsed() -> None:
    record = record_message(_record({}), "tasks.dlx", "task")
    body = record.body.replace(b'"attempts":1', b'"attempts":NaN')
    assert body != record.body and view_of(record.body, _record_props()).source == "record"
    entry = view_of(body, _record_props())
    assert entry.source == "raw"
    assert decode_payload(entry.payload, entry.payload_encoding) == body


def test_view_of_never_raises_even_on_properties_nobody_foresaw() -> None:
    class Hostile:
        type = RECORD_TYPE

        @property
        def headers(self) -> Any:
            raise RuntimeError("boom")

    entry = view_of(b"{}", Hostile())
    assert (entry.source, entry.error_type) == ("unreadable", "unreadable")
    assert "RuntimeError: boom" in entry.error_message
    check_entry(entry)


@pytest.mark.parametrize(
    "deaths",
    [5, "rejected", {"reason": "x"}, [5], [{"routing-keys": 5}], [{"routing-keys": []}], []],
)
def test_an_x_death_header_of_any_shape_is_read(deaths: Any) -> None:
    entry = view_of(b"x", delivered({"headers": {"x-death": deaths}, "message_id": "m-1"}))
    check_entry(entry)
    assert entry.source == ("x-death" if isinstance(deaths, list) and deaths else "raw")


@pytest.mark.parametrize(
    "first_seen",
    ["yesterday", "2026-11-29T17:40:00", 5, b"\xff", datetime(9999, 12, 31), None],
)
def test_summaries_and_selections_take_any_time_a_header_holds(first_seen: Any) -> None:
    headers = {"first_seen_at": first_seen, "x-death": [{"time": first_seen}]}
    entry = view_of(b"x", delivered({"headers": headers}))
    assert summarize([entry], NOW).depth == 1
    assert Selection(since=NOW).matches(entry) in (True, False)


def test_a_time_without_a_zone_is_utc() -> None:
    assert time_of("2026-11-29T17:40:00") == datetime(2026, 11, 29, 17, 40, tzinfo=UTC)
    assert time_of("yesterday") is None and time_of(None) is None


def _record_props() -> SimpleNamespace:
    return SimpleNamespace(type=RECORD_TYPE, headers={}, message_id="m-1")


# --- records: standard JSON, NaN headers kept by the typed encoding ----------------------------
def _record(headers: dict[str, Any]) -> dict[str, Any]:
    return build_record(
        body=b'{"a":1}',
        message_id="m-1",
        exchange="tasks",
        routing_key="task",
        queue="q:tasks",
        properties={"content_type": "application/json"},
        headers=headers,
        error=BusinessError("bad"),
        classification="business",
        attempts=1,
        first_seen_at="2026-11-29T17:40:00.000Z",
        failed_at=NOW.timestamp(),
    )


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("-nan"), float("inf"), float("-inf"), TaggedFloat(float("inf"))],
    ids=["nan", "-nan", "inf", "-inf", "f-inf"],
)
def test_a_nan_or_infinite_header_is_kept_by_a_strict_record(value: float) -> None:
    body = encode_record(_record({"v": value, "nested": [value, {"w": value}]}))
    assert b"NaN" not in body and b"Infinity" not in body
    strict(body)
    entry = view_of(body, _record_props())
    assert entry.source == "record"
    assert same(entry.headers, {"v": value, "nested": [value, {"w": value}]})


@settings(max_examples=100, deadline=None)
@given(
    headers=st.dictionaries(
        st.text(max_size=5),
        field_tables.map(lambda t: list(t.values())) | st.floats().map(TaggedFloat) | st.floats(),
        max_size=4,
    ),
    body=st.binary(max_size=30) | st.sampled_from([b"NaN", b"[1,Infinity]", b'{"x":-Infinity}']),
)
def test_every_record_is_standard_json(headers: dict[str, Any], body: bytes) -> None:
    record = build_record(**{**_args(body), "headers": headers})
    text = encode_record(record)
    assert strict(text)["message_id"] == "m-1"
    entry = view_of(text, _record_props())
    assert entry.source == "record"
    assert decode_payload(entry.payload, entry.payload_encoding) == body
    assert same(entry.headers, headers)


def _args(body: bytes) -> dict[str, Any]:
    return {
        "body": body,
        "message_id": "m-1",
        "exchange": "tasks",
        "routing_key": "task",
        "queue": "q:tasks",
        "properties": {},
        "headers": {},
        "error": BusinessError("bad"),
        "classification": "business",
        "attempts": 1,
        "first_seen_at": "2026-11-29T17:40:00.000Z",
        "failed_at": NOW.timestamp(),
    }


# --- keys and the stream reader's entries ------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "keyed"),
    [("k-1", True), (b"k-\xff", True), ("", False), (5, False), ("k" * 256, False), (None, False)],
)
def test_a_key_header_of_any_value_is_a_key_or_unkeyed(value: Any, keyed: bool) -> None:
    found = keys_from_headers([{"key": value}, None])
    assert (len(found.keys), found.unkeyed) == ((1, 1) if keyed else (0, 2))


@settings(max_examples=200, deadline=None)
@given(fields=foreign_properties, body=st.binary(max_size=20))
def test_a_stream_entry_is_made_of_any_delivery(fields: dict[str, Any], body: bytes) -> None:
    properties = delivered(fields)
    method = SimpleNamespace(exchange="tasks", routing_key=b"task-\xff")
    entry = _entry(7, method, properties, body)
    assert isinstance(entry, StreamEntry) and entry.offset == 7
    assert entry.routing_key == "task-\\xff"
    stamp = fields.get("timestamp")
    assert entry.properties.get("timestamp") == stamp
    if stamp is not None and stamp <= 253402300799:
        assert entry.timestamp == datetime.fromtimestamp(stamp, UTC)
    else:
        assert entry.timestamp is None  # beyond year 9999: kept as a number in properties
    raw_id = fields.get("message_id")
    assert entry.message_id == (raw_id if isinstance(raw_id, str) else None)
    assert entry.properties.get("message_id") == raw_id


def test_a_tagged_timestamp_header_reads() -> None:
    entry = _entry(
        1,
        SimpleNamespace(exchange="", routing_key="q"),
        delivered({"headers": {"t": TaggedInt(2**63, "T")}, "timestamp": 2**64 - 1}),
        b"",
    )
    assert entry.timestamp is None and entry.headers["t"] == 2**63


def test_a_record_of_an_error_with_a_lone_surrogate_is_shown_escaped() -> None:
    """build_record keeps such an exception message (JSON-escaped); a page or a UTF-8 line
    cannot hold it, so the view writes it as \\udcff."""
    body = encode_record(build_record(**{**_args(b"{}"), "error": ValueError("bad \udcff")}))
    entry = view_of(body, _record_props())
    assert (entry.source, entry.error_message) == ("record", "bad \\udcff")


@pytest.mark.parametrize(
    ("field", "value"),
    [("message_id", "m-\ud800"), ("message_id", "m" * 256), ("classification", "\udcff")],
)
def test_a_record_with_a_field_no_message_carries_is_shown_raw(field: str, value: str) -> None:
    body = json.dumps({**_record({}), field: value}).encode()
    entry = view_of(body, _record_props())
    assert entry.source == "raw" and entry.message_id == "m-1"  # the delivery's own id
    check_entry(entry)
