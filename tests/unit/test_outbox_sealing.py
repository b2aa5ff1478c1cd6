"""A relay's plain rows sealed straight from their columns (amqp_lab.outbox.sealing): the same
bytes as the general path (message_of, relay_message, sealed_properties) on generated
messages, and None - the general path, which names the fault - for every row that is not
plain."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab.errors import UnencodableMessage
from amqp_lab.fieldtable import encode_table
from amqp_lab.message import OutgoingMessage
from amqp_lab.outbox import flight as outbox_flight
from amqp_lab.outbox.lease import Lease
from amqp_lab.outbox.observer import NO_RELAY_OBSERVER, RelayConfig
from amqp_lab.outbox.outcomes import Verdict
from amqp_lab.outbox.row import (
    OutboxRow,
    RowUndecodable,
    UndecodableText,
    message_of,
    row_values,
)
from amqp_lab.outbox.sealing import sealed, template_of
from amqp_lab.outbox.trace import relay_message
from amqp_lab.wire import AmqpProperties, PropertiesTemplate
from tests.amqp_values import field_tables
from tests.unit.test_outbox import _row as outbox_row

pytestmark = pytest.mark.unit

NOW = 1_800_000_000
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _row(message: OutgoingMessage, **overrides: Any) -> OutboxRow:
    return outbox_row(row_values(message), **overrides)


def _general(row: OutboxRow) -> bytes:
    """What the relay's general path encodes for ``row`` at NOW (its clock frozen there)."""
    message, _ = relay_message(message_of(row), row.traceparent, row.tracestate, False)
    with mock.patch("time.time", return_value=NOW + 0.75):
        return b"".join(message.sealed_properties().encode())


_short = st.text(max_size=20)
_texts = st.none() | _short
messages = st.builds(
    OutgoingMessage,
    body=st.binary(max_size=32),
    message_id=st.text(min_size=1, max_size=40).filter(lambda m: "\x00" not in m),
    exchange=_short,
    routing_key=_short,
    content_type=_short,
    headers=field_tables,
    persistent=st.booleans(),
    timestamp=st.none() | st.integers(0, 2**64 - 1),
    type=_texts,
    expiration=st.none() | st.integers(0, 10**9).map(str),
    priority=st.none() | st.integers(0, 255),
    correlation_id=_texts,
    reply_to=_texts,
    content_encoding=_texts,
    app_id=_texts,
)


@settings(max_examples=300, deadline=None)
@given(
    message=messages,
    trace=st.sampled_from([(None, None), (PARENT, None), (PARENT, "k=v")]),
    writer_trace=st.booleans(),
)
def test_a_plain_row_seals_to_the_bytes_of_the_general_path(
    message: OutgoingMessage, trace: tuple[str | None, str | None], writer_trace: bool
) -> None:
    if writer_trace:  # a trace header the writer put there: the stored context replaces it
        headers = message.headers | {"traceparent": "00-writer", "tracestate": "w=1"}
        message = OutgoingMessage(**(vars(message) | {"headers": headers}))
    row = _row(message, traceparent=trace[0], tracestate=trace[1])
    properties = sealed(row, NOW)
    assert properties is not None
    assert properties.data == _general(row)
    assert properties.encode() == [properties.data]
    assert properties.INDEX == AmqpProperties.INDEX


@settings(max_examples=200, deadline=None)
@given(
    content_type=_texts,
    content_encoding=_texts,
    headers=st.none() | field_tables.filter(bool),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=_texts,
    reply_to=_texts,
    expiration=_texts,
    message_id=_short,
    timestamp=st.none() | st.integers(0, 2**64 - 1),
    type=_texts,
    user_id=_texts,
    app_id=_texts,
    cluster_id=_texts,
)
def test_a_template_seals_what_amqp_properties_encode(**fields: Any) -> None:
    """Every property, user_id and cluster_id (which no row holds) included."""
    template = PropertiesTemplate.of(AmqpProperties(**fields))
    headers = None if fields["headers"] is None else encode_table(fields["headers"])
    sealed_now = template.seal(headers, fields["message_id"], NOW)
    expected = AmqpProperties(**(fields | {"timestamp": fields["timestamp"] or NOW}))
    if fields["timestamp"] == 0:
        expected.timestamp = 0
    assert sealed_now.data == b"".join(expected.encode())


def test_a_template_refuses_what_encode_refuses() -> None:
    template = PropertiesTemplate.of(AmqpProperties(content_type="x"))
    with pytest.raises(Exception, match="message_id is longer than 255 bytes"):
        template.seal(None, "m" * 256, NOW)
    with pytest.raises(Exception, match="timestamp"):
        template.seal(None, "m", -1)
    with pytest.raises(Exception, match="priority"):
        PropertiesTemplate.of(AmqpProperties(priority=256))


def _plain() -> OutboxRow:
    return _row(OutgoingMessage(body=b"{}", message_id="m", exchange="x", routing_key="r"))


def _hostile_headers() -> bytes:
    return b"\x00\x00\x00\x05\x01aZ"  # a field of an unknown type


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        ({"message_id": ""}, RowUndecodable),
        ({"message_id": None}, RowUndecodable),
        ({"message_id": UndecodableText(b"m\xff")}, RowUndecodable),
        ({"ordering_key": UndecodableText(b"k\xff")}, RowUndecodable),
        ({"exchange": UndecodableText(b"x\xff")}, RowUndecodable),
        ({"routing_key": 7}, RowUndecodable),
        ({"properties": UndecodableText(b"{}\xff")}, RowUndecodable),
        ({"properties": "not json"}, RowUndecodable),
        ({"properties": '{"priority": "high"}'}, RowUndecodable),
        ({"properties": "[]"}, RowUndecodable),
        ({"body": "text"}, RowUndecodable),
        ({"headers": _hostile_headers()}, RowUndecodable),
        ({"headers": encode_table({"a": 1}) + b"\x00"}, RowUndecodable),
        ({"headers": "text"}, RowUndecodable),
        # written by hand past row_values' checks: the broker would refuse them
        ({"properties": '{"expiration": "soon", "persistent": true}'}, UnencodableMessage),
        ({"properties": '{"priority": 300, "persistent": true}'}, UnencodableMessage),
        ({"exchange": "x" * 256}, UnencodableMessage),
        ({"routing_key": "\udc80"}, UnencodableMessage),
        ({"message_id": "m" * 256}, UnencodableMessage),
        ({"message_id": "\udc80"}, UnencodableMessage),
        ({"headers": encode_table({"big": "x" * 140_000})}, UnencodableMessage),
        # a long string of bytes that are not UTF-8: both paths carry it as they decode it
        ({"headers": b"\x00\x00\x00\x08\x01sS\x00\x00\x00\x01\xff"}, None),
    ],
)
def test_a_row_that_is_not_plain_takes_the_general_path(change: dict[str, Any], fault: Any) -> None:
    """sealed() answers None, and the general path says what is wrong with the row."""
    row = _plain()._replace(**change)
    if fault is None:  # plain after all: the same bytes either way
        properties = sealed(row, NOW)
        assert properties is not None and properties.data == _general(row)
        return
    assert sealed(row, NOW) is None
    with pytest.raises(fault):
        _general(row)


def test_a_long_properties_column_takes_the_general_path_and_goes() -> None:
    """Over 2,048 characters (never cached), yet properties AMQP carries: control characters
    take six in JSON, one byte on the wire."""
    long_type = "\x01" * 255
    row = _row(OutgoingMessage(body=b"", message_id="m", type=long_type, app_id=long_type))
    assert len(row.properties) > 2048
    assert sealed(row, NOW) is None
    assert message_of(row).type == long_type
    assert len(_general(row)) > 510


def test_templates_are_cached_per_column_and_bad_columns_are_none() -> None:
    template_of.cache_clear()
    column = _plain().properties
    assert template_of(column) is template_of(column)
    assert template_of.cache_info().hits == 1
    assert template_of('{"priority": 999, "persistent": true}') is None
    assert template_of("{") is None


def _long_properties() -> str:
    long_type = "\x01" * 255
    message = OutgoingMessage(body=b"", message_id="m", type=long_type, app_id=long_type)
    return row_values(message).properties


class _Publisher:
    failure = None

    def __init__(self) -> None:
        self.sealed: list[Any] = []
        self.general: list[Any] = []

    def publish_each(self, ready: list[Any]) -> None:
        self.general.extend(message for message, _ in ready)

    def publish_sealed(self, plain: list[Any]) -> None:
        self.sealed.extend((row, properties) for row, properties, _ in plain)


def _flight(monkeypatch: pytest.MonkeyPatch, spans: bool) -> tuple[Any, _Publisher, list[Any]]:
    monkeypatch.setattr(outbox_flight, "recording", lambda: spans)
    reports: list[Any] = []
    flight = outbox_flight.Flight(RelayConfig(), NO_RELAY_OBSERVER, reports.append, lambda: None)
    publisher = _Publisher()
    flight.publisher = publisher  # type: ignore[assignment]
    plain = _plain()
    rows = {
        1: plain._replace(id=1, message_id="p-1"),
        2: plain._replace(id=2, message_id="bad", headers=_hostile_headers()),
        3: plain._replace(id=3, message_id="long", properties=_long_properties()),
    }
    flight.start(Lease(rows=rows, chains=[[1], [2], [3]]))
    return flight, publisher, reports


def test_a_hand_over_seals_plain_rows_and_sends_the_others_as_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, publisher, reports = _flight(monkeypatch, spans=False)
    assert [(row.message_id, type(p).__name__) for row, p in publisher.sealed] == [
        ("p-1", "SealedProperties")
    ]
    assert [m.message_id for m in publisher.general] == ["long"]
    assert [(r.message_id, r.outcome) for r in reports] == [("bad", Verdict.REFUSED.value)]
    assert "not an AMQP field table" in (reports[0].error or "")


def test_while_spans_record_every_row_goes_as_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish span per row: the general path opens them."""
    _, publisher, _ = _flight(monkeypatch, spans=True)
    assert publisher.sealed == []
    assert [m.message_id for m in publisher.general] == ["p-1", "long"]
