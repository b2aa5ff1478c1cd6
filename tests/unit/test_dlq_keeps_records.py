"""What can drop a record the DLQ confirmed (pure): every setting that is refused, and what
is not; and the raw form of a record that would not fit as JSON, read back losslessly."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab.dlq.raw_record import RAW_RECORD_HEADER, raw_record_message
from amqp_lab.dlq.record import RECORD_TYPE, build_record
from amqp_lab.dlq.view import replay_message, view_of
from amqp_lab.errors import BusinessError
from amqp_lab.fieldtable import TaggedInt
from amqp_lab.message import MAX_PROPERTIES_BYTES, PROPERTY_NAMES, OutgoingMessage, user_headers
from amqp_lab.topology.retry_check import RetryExpectations, dlq_problems, problems
from amqp_lab.wire import AmqpProperties
from tests.amqp_values import field_tables, same

pytestmark = pytest.mark.unit


def dlq(
    definition: dict[str, Any] | None = None,
    *,
    policy: str | None = "q-tasks-dlq",
    operator: str | None = None,
    kind: str = "classic",
    **fields: Any,
) -> dict[str, Any]:
    """A DLQ as GET /api/queues/{vhost}/{name} shows it, with ``definition`` as its effective
    policy and ``fields`` (arguments, durable, delivery_limit...) over the defaults."""
    return {
        "name": "q:tasks:dlq",
        "type": kind,
        "durable": True,
        "auto_delete": False,
        "arguments": {},
        "policy": policy,
        "operator_policy": operator,
        "effective_policy_definition": definition or {},
    } | fields


@pytest.mark.parametrize(
    "queue",
    [
        dlq({"queue-mode": "lazy"}),
        dlq({"max-length": 100, "overflow": "reject-publish"}),
        dlq({"max-length-bytes": 10**9, "overflow": "reject-publish-dlx"}),
        dlq(kind="quorum", delivery_limit="unlimited"),  # 4.3 reports the limit in force
        dlq({"delivery-limit": -1}, kind="quorum"),  # 4.0: our quorum topology's policy
    ],
    ids=[
        "lazy",
        "limit-reject-publish",
        "bytes-reject-publish-dlx",
        "4.3-unlimited",
        "4.0-minus-1",
    ],
)
def test_settings_that_keep_every_record_pass(queue: dict[str, Any]) -> None:
    assert dlq_problems("q:tasks:dlq", queue, (4, 3)) == []


@pytest.mark.parametrize(
    ("queue", "says"),
    [
        (None, "does not exist"),
        (
            dlq({"max-length": 5, "queue-mode": "lazy"}, operator="cap"),
            "drops its oldest records past max-length 5 (overflow drop-head; policy "
            "'q-tasks-dlq' with operator policy 'cap')",
        ),
        (dlq({"max-length-bytes": 1000, "overflow": "drop-head"}), "past max-length-bytes 1000"),
        (dlq(arguments={"x-max-length": 3}), "past max-length 3"),
        (dlq({"message-ttl": 60000}), "drops records after message-ttl 60000 ms"),
        (dlq({"expires": 3600000}, operator="reaper"), "expires after 3600000 ms unused"),
        (dlq(kind="stream"), "is a stream"),
        (dlq(durable=False), "is not durable"),
        (dlq(auto_delete=True), "is auto-delete"),
        (dlq(kind="quorum", delivery_limit=20), "delivery-limit 20"),
        (dlq(kind="quorum"), "delivery-limit 20"),  # 4.0 without a setting: the default
        (
            dlq({"delivery-limit": -1}, kind="quorum", arguments={"x-delivery-limit": 5}),
            "delivery-limit 5",
        ),
    ],
    ids=[
        "missing",
        "operator-max-length",
        "max-length-bytes",
        "argument",
        "message-ttl",
        "expires",
        "stream",
        "transient",
        "auto-delete",
        "quorum-4.3",
        "quorum-4.0-default",
        "quorum-argument-wins",
    ],
)
def test_settings_that_can_drop_a_record_are_refused_naming_the_policy(
    queue: dict[str, Any] | None, says: str
) -> None:
    found = dlq_problems("q:tasks:dlq", queue, (4, 0))
    assert len(found) == 1 and says in found[0], found


def test_a_quorum_dlq_without_a_limit_on_3_10_has_none() -> None:
    assert dlq_problems("q:tasks:dlq", dlq(kind="quorum"), (3, 10)) == []


def test_the_dlq_is_checked_with_the_rest_of_the_topology() -> None:
    expect = RetryExpectations("v", "q:tasks", (), "", None, "q:tasks:dlq")
    work = dlq({"dead-letter-exchange": "tasks.dlx"}, policy="q-tasks-dlx")
    found = problems(expect, work, {}, None, [], dlq({"message-ttl": 5}), (4, 3))
    assert found == [
        "DLQ 'q:tasks:dlq' drops records after message-ttl 5 ms (policy 'q-tasks-dlq')"
    ]


# --- the raw form ---------------------------------------------------------------------------
def _delivered(message: Any) -> Any:
    """The message's properties as a consumer decodes them off the wire."""
    encoded = message.sealed_properties().encode()[0]
    props = AmqpProperties()
    props.decode(encoded)
    return props


def _record(body: bytes, headers: dict[Any, Any], properties: dict[str, Any]) -> dict[str, Any]:
    return build_record(
        body=body,
        message_id="m-big",
        exchange="tasks",
        routing_key="task",
        queue="q:tasks",
        properties=properties,
        headers=headers,
        error=BusinessError("too big to handle"),
        classification="business",
        attempts=1,
        first_seen_at="2026-12-03T08:00:00.000Z",
        failed_at=1_764_748_800.0,
    )


PROPERTIES = {
    "content_type": "application/octet-stream",
    "correlation_id": "c-1",
    "priority": 3,
    "timestamp": 1_764_748_700,
    "type": "upload",
    "expiration": "60000",
    "app_id": "uploader",
}


@settings(max_examples=40, deadline=None)
@given(body=st.binary(max_size=3000), published=field_tables)
def test_the_raw_form_reads_back_and_replays_exactly(
    body: bytes, published: dict[Any, Any]
) -> None:
    headers = _delivered(OutgoingMessage(b"", "m-big", headers=published)).headers or {}
    record = _record(body, headers, PROPERTIES)
    message = raw_record_message(
        record,
        body=body,
        headers=headers,
        properties=PROPERTIES,
        dlx="tasks.dlx",
        routing_key="task",
    )
    assert message is not None  # generated headers are small: the record always fits
    assert message.body == body and message.type == RECORD_TYPE
    assert message.expiration is None  # the record never expires
    entry = view_of(body, _delivered(message))
    assert (entry.source, entry.message_id, entry.attempts) == ("record", "m-big", 1)
    assert entry.error_message == "too big to handle"
    replay = replay_message(entry)
    assert replay.body == body
    assert same(replay.headers, {**user_headers(headers), "attempts": 0})
    assert (replay.exchange, replay.routing_key, replay.type, replay.priority) == (
        "tasks",
        "task",
        "upload",
        3,
    )


def test_the_raw_form_keeps_header_types_and_a_shadowed_header() -> None:
    headers = {"n": TaggedInt(7, "b"), RAW_RECORD_HEADER: "the publisher's own", "tenant": "a"}
    record = _record(b"\x00" * 10, headers, PROPERTIES)
    message = raw_record_message(
        record, body=b"\x00" * 10, headers=headers, properties=PROPERTIES, dlx="d", routing_key="k"
    )
    assert message is not None
    entry = view_of(b"\x00" * 10, _delivered(message))
    assert (
        entry.headers["tenant"] == "a" and entry.headers[RAW_RECORD_HEADER] == "the publisher's own"
    )
    assert isinstance(entry.headers["n"], TaggedInt) and entry.headers["n"].tag == "b"
    assert entry.properties["expiration"] == "60000"  # in the metadata, not on the record


def test_headers_near_the_frame_limit_shrink_the_metadata_then_give_up() -> None:
    error = BusinessError("x" * 1900)
    for room, fits in ((3000, True), (20, False)):
        filler = "h" * (MAX_PROPERTIES_BYTES - room)
        headers = {"filler": filler}
        record = build_record(
            body=b"b",
            message_id="m",
            exchange="e",
            routing_key="k",
            queue="q",
            properties={},
            headers=headers,
            error=error,
            classification="unknown",
            attempts=1,
            first_seen_at="t",
            failed_at=0.0,
        )
        message = raw_record_message(
            record, body=b"b", headers=headers, properties={}, dlx="d", routing_key="k"
        )
        assert (message is not None) is fits
        if message is not None:
            entry = view_of(b"b", _delivered(message))
            assert entry.headers["filler"] == filler and entry.traceback is None


def test_a_damaged_raw_form_is_shown_raw_not_hidden() -> None:
    props = SimpleNamespace(**{name: None for name in PROPERTY_NAMES}, message_id="m")
    props.type, props.headers = RECORD_TYPE, {RAW_RECORD_HEADER: "{not json"}
    entry = view_of(b"body", props)
    assert entry.source == "raw" and entry.payload == "body"
