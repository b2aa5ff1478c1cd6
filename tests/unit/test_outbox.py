"""The outbox's pure parts: the row codec (lossless, hostile rows refused with a reason), the
chains a relay publishes (a key's next row only after the previous one was confirmed), each
publish outcome's verdict, and the status's alert lines."""

from __future__ import annotations

import copy
import json
import math
import pickle
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_lab.errors import (
    BrokerBlocked,
    ConfigurationError,
    MessageNacked,
    MessageUnroutable,
    NotFound,
    PreconditionFailed,
    PublishFailed,
    UnencodableMessage,
)
from amqp_lab.fieldtable import encode_table
from amqp_lab.message import OutgoingMessage
from amqp_lab.outbox import flight as outbox_flight
from amqp_lab.outbox import trace as outbox_trace
from amqp_lab.outbox.chains import Candidate, ChainRun, cut, plan
from amqp_lab.outbox.db import MAX_LOCK_TIMEOUT
from amqp_lab.outbox.lease import Lease, leased_row
from amqp_lab.outbox.observer import NO_RELAY_OBSERVER, RelayConfig
from amqp_lab.outbox.outcomes import PARKED, Verdict, judge, refusal_delay, result_for
from amqp_lab.outbox.row import (
    OutboxRow,
    RowUndecodable,
    UndecodableText,
    _parse_properties,
    due_seconds,
    message_of,
    ordering_key_of,
    row_values,
    sqlite_text,
)
from amqp_lab.outbox.schema import schema
from amqp_lab.outbox.sql import bound, in_list, mark
from amqp_lab.outbox.status import OutboxStatus, RelaySeen, outbox_problems
from amqp_lab.outbox.store import OutboxStore
from tests.amqp_values import field_tables, same

pytestmark = pytest.mark.unit


def _message(**fields: Any) -> OutgoingMessage:
    base: dict[str, Any] = {"body": b"{}", "message_id": "m-1", "exchange": "x", "routing_key": "r"}
    return OutgoingMessage(**(base | fields))


def _row(values: Any, **overrides: Any) -> OutboxRow:
    columns: dict[str, Any] = {
        "id": 1,
        "message_id": values.message_id,
        "ordering_key": values.ordering_key,
        "exchange": values.exchange,
        "routing_key": values.routing_key,
        "properties": values.properties,
        "headers": values.headers,
        "body": values.body,
        "traceparent": values.traceparent,
        "tracestate": values.tracestate,
        "created_at": 100.0,
        "due_at": values.due_at,
        "tries": 1,
    }
    return OutboxRow(**(columns | overrides))


# --- the row codec ---------------------------------------------------------------------------
@given(headers=field_tables, body=st.binary(max_size=64))
def test_a_message_comes_back_from_its_row_with_every_header_type_and_byte(
    headers: dict[str, Any], body: bytes
) -> None:
    message = _message(
        body=body,
        headers=headers,
        content_type="application/octet-stream",
        priority=7,
        expiration="60000",
        correlation_id="c",
        timestamp=1700000000,
        persistent=False,
    )
    back = message_of(_row(row_values(message)))
    assert same(back.headers, headers)
    assert (back.body, back.priority, back.expiration, back.correlation_id) == (
        body,
        7,
        "60000",
        "c",
    )
    assert (back.timestamp, back.persistent, back.content_type) == (
        1700000000,
        False,
        "application/octet-stream",
    )
    assert back.properties().encode() == message.properties().encode()


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"priority": 300}, "priority"),
        ({"expiration": "soon"}, "expiration"),
        ({"headers": {"a": {1, 2}}}, "set"),
        ({"headers": {"big": "x" * 140_000}}, "more than one frame"),
        ({"routing_key": "k" * 256}, "longer than 255 bytes"),
        ({"message_id": ""}, "needs a message_id"),
        ({"message_id": "m-\x00"}, "NUL character"),
    ],
)
def test_what_no_broker_would_take_is_refused_before_a_row_is_written(
    fields: dict[str, Any], reason: str
) -> None:
    with pytest.raises(UnencodableMessage, match=reason):
        row_values(_message(**fields))


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"properties": "{not json"}, "not standard JSON"),
        ({"properties": '{"priority": NaN}'}, "not standard JSON"),
        ({"properties": "[1]"}, "not a JSON object"),
        ({"properties": '{"priority": "high"}'}, "'priority'"),
        ({"properties": '{"persistent": 1}'}, "'persistent'"),
        ({"properties": '{"user_id": "root"}'}, "'user_id'"),
        ({"headers": b"\x00\x00\x00\x05abc"}, "not an AMQP field table"),
        ({"headers": encode_table({"a": 1}) + b"zz"}, "2 bytes after"),
        ({"headers": "text"}, "not an AMQP field table"),
        ({"body": "text, not bytes"}, "not bytes"),
        ({"message_id": None}, "no message_id"),
        ({"exchange": 7}, "exchange is not text"),
    ],
)
def test_a_hostile_row_is_undecodable_with_its_reason(
    overrides: dict[str, Any], reason: str
) -> None:
    with pytest.raises(RowUndecodable, match=reason):
        message_of(_row(row_values(_message()), **overrides))


@pytest.mark.parametrize(
    "column", ["message_id", "ordering_key", "exchange", "routing_key", "properties"]
)
def test_a_column_sqlite_could_not_read_as_utf8_makes_its_row_undecodable(column: str) -> None:
    text = sqlite_text(b"{\xff}")
    assert isinstance(text, UndecodableText) and str(text) == "{\ufffd}"
    assert type(sqlite_text("k\u00e9".encode())) is str  # UTF-8: plain text
    with pytest.raises(RowUndecodable, match=f"column {column} is not UTF-8 text"):
        message_of(_row(row_values(_message()), **{column: text}))


def test_text_that_is_not_utf8_is_bound_as_its_stored_bytes() -> None:
    """A key read back from SQLite as U+FFFD text must find its rows again: bound as its bytes,
    cast to text; equal only to the same bytes (two keys that show alike stay two)."""
    bad, other = sqlite_text(b"k\xff"), sqlite_text(b"k\xfe")
    assert isinstance(bad, UndecodableText) and bad.raw == b"k\xff"
    assert copy.deepcopy(bad) == pickle.loads(pickle.dumps(bad)) == bad  # observers may copy
    assert str(bad) == str(other) == "k\ufffd" and bad != other and bad != "k\ufffd"
    assert len({bad, other, sqlite_text(b"k\xff")}) == 2
    assert in_list("sqlite", "ordering_key", ["a", bad]) == (
        "ordering_key IN (?,CAST(? AS TEXT))",
        ("a", b"k\xff"),
    )
    db = sqlite3.connect(":memory:")
    db.text_factory = sqlite_text
    db.execute("CREATE TABLE t (k TEXT)")
    db.execute("INSERT INTO t VALUES (CAST(x'6bff' AS TEXT)), (CAST(x'6bfe' AS TEXT))")
    (key,) = db.execute("SELECT k FROM t WHERE k = CAST(x'6bff' AS TEXT)").fetchone()
    assert key == bad
    found = db.execute(f"SELECT count(*) FROM t WHERE k = {mark(key)}", (bound(key),))
    assert found.fetchone() == (1,)


def test_a_trace_context_that_is_not_utf8_is_dropped_not_the_row() -> None:
    values = (1, "m", "k", "x", "rk", "{}", b"\x00\x00\x00\x00", b"{}")
    row = leased_row((*values, sqlite_text(b"\xff"), sqlite_text(b"\xfe"), 0.0, None, 1))
    assert (row.traceparent, row.tracestate) == (None, None)
    assert message_of(row).message_id == "m"


def test_a_hostile_rows_properties_are_refused_every_time_not_remembered() -> None:
    """The properties column's parse is cached per text; a failure is not: the same bad row,
    leased again, is refused again with its reason."""
    bad = _row(row_values(_message()), properties='{"priority": "high"}')
    for _ in range(2):
        with pytest.raises(RowUndecodable, match="'priority'"):
            message_of(bad)


def test_rows_sharing_their_properties_text_come_back_as_their_own_messages() -> None:
    """Rows with the same properties column share one parse (cached) and still come back with
    their own message_id, headers and body."""
    _parse_properties.cache_clear()
    first = _message(message_id="m-1", headers={"n": 1}, body=b"1", priority=3)
    second = _message(message_id="m-2", headers={"n": 2}, body=b"2", priority=3)
    backs = [message_of(_row(row_values(m))) for m in (first, second, first)]
    assert [(b.message_id, b.headers, b.body, b.priority) for b in backs] == [
        ("m-1", {"n": 1}, b"1", 3),
        ("m-2", {"n": 2}, b"2", 3),
        ("m-1", {"n": 1}, b"1", 3),
    ]
    assert _parse_properties.cache_info().hits == 2


def test_a_long_properties_column_is_parsed_but_never_cached() -> None:
    """A hostile table of long, distinct property texts cannot grow the cache."""
    _parse_properties.cache_clear()
    long_type = "application/" + "x" * 3000
    row = _row(row_values(_message()), properties=json.dumps({"type": long_type}))
    assert message_of(row).type == long_type
    assert _parse_properties.cache_info().currsize == 0


def test_the_relay_asks_whether_spans_record_once_per_hand_over_not_per_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """relay_message takes the batch's answer (without an SDK, OpenTelemetry's reads
    os.environ); the stored trace context still replaces the writer's trace headers."""

    def asked() -> bool:
        raise AssertionError("recording() asked per row")

    monkeypatch.setattr(outbox_trace, "recording", asked)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = _message(headers={"traceparent": "00-forged", "a": 1})
    relayed, span = outbox_trace.relay_message(message, parent, "k=v", spans_record=False)
    assert span is None
    assert relayed.headers == {"a": 1, "traceparent": parent, "tracestate": "k=v"}
    same_message, span = outbox_trace.relay_message(_message(), None, None, spans_record=False)
    assert span is None and same_message == _message()


def test_a_hand_over_of_many_rows_asks_about_spans_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flight._publish asks OpenTelemetry once for all the rows it hands to the publisher."""
    asked: list[bool] = []

    def recording() -> bool:
        asked.append(True)
        return False

    class Publisher:
        failure = None

        def __init__(self) -> None:
            self.handed: list[Any] = []

        def publish_each(self, ready: list[Any]) -> None:
            self.handed.extend(message for message, _ in ready)

        def publish_sealed(self, plain: list[Any]) -> None:
            self.handed.extend(row for row, _, _ in plain)

    monkeypatch.setattr(outbox_flight, "recording", recording)
    flight = outbox_flight.Flight(RelayConfig(), NO_RELAY_OBSERVER, None, lambda: None)
    publisher = Publisher()
    flight.publisher = publisher  # type: ignore[assignment]
    rows = {
        i: _row(row_values(_message(message_id=f"m-{i}")), id=i, ordering_key=None)
        for i in (1, 2, 3)
    }
    lease = Lease(rows=rows, chains=[[1], [2], [3]])
    flight.start(lease)
    assert asked == [True]
    assert [m.message_id for m in publisher.handed] == ["m-1", "m-2", "m-3"]


def test_due_at_is_an_aware_datetime_or_finite_epoch_seconds() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert due_seconds(when) == when.timestamp()
    assert due_seconds(12.5) == 12.5 and due_seconds(None) is None
    assert due_seconds(2**62) == float(2**62)
    # 10**400: an int past a float's range (before: OverflowError, not this error)
    for bad in (datetime(2030, 1, 1), math.nan, math.inf, True, "tomorrow", 10**400):
        with pytest.raises(ConfigurationError):
            due_seconds(bad)  # type: ignore[arg-type]


def test_the_ordering_key_defaults_to_the_key_header() -> None:
    assert ordering_key_of(_message(headers={"key": "order-1"}), None) == "order-1"
    assert ordering_key_of(_message(headers={"key": "order-1"}), "other") == "other"
    assert ordering_key_of(_message(headers={"key": 7}), None) is None
    assert ordering_key_of(_message(), None) is None
    for bad in ("", "\ud800"):
        with pytest.raises(ConfigurationError):
            ordering_key_of(_message(), bad)


def test_a_rows_due_time_is_its_creation_or_later() -> None:
    values = row_values(_message(), due_at=50.0)
    assert _row(values).due == 100.0  # due before it was written: due at once
    assert _row(values, due_at=150.0).due == 150.0


# --- chains ----------------------------------------------------------------------------------
def test_a_chain_is_a_head_and_its_keys_ready_rows_in_id_order() -> None:
    heads = [Candidate(1, "a", 10), Candidate(2, None, 10), Candidate(5, "b", 10)]
    followers = [
        Candidate(7, "a", 10),
        Candidate(3, "a", 10),
        Candidate(9, "a", 10, ready=False),  # not due yet: holds 11
        Candidate(11, "a", 10),
        Candidate(6, "b", 10),
        Candidate(4, "z", 10),  # no head for it
    ]
    assert plan(heads, followers, 100, 1000) == [[1, 3, 7], [2], [5, 6]]


def test_a_batch_keeps_its_budget_but_always_takes_one_row() -> None:
    heads = [Candidate(1, "a", 500), Candidate(2, "b", 10)]
    followers = [Candidate(3, "a", 10)]
    assert plan(heads, followers, 100, 100) == [[1]]  # the huge first row goes alone
    assert plan(heads, followers, 2, 10_000) == [[1], [2]]  # heads take the budget first
    assert plan([Candidate(1, "a", 1), Candidate(2, "a", 1)], [], 10, 10) == [[1]]


def test_a_cut_drops_the_rest_of_a_chain_after_a_row_the_lease_did_not_get() -> None:
    chains = [[1, 3, 7], [2], [5, 6]]
    assert cut(chains, {1, 7, 2, 6}) == ([[1], [2]], [7, 6])


@given(
    chains=st.lists(
        st.lists(st.integers(1, 10**6), min_size=1, max_size=5, unique=True), max_size=6
    ),
    outcomes=st.lists(st.booleans(), max_size=40),
)
def test_a_chains_rows_go_out_one_at_a_time_in_order_and_stop_at_a_failure(
    chains: list[list[int]], outcomes: list[bool]
) -> None:
    seen: set[int] = set()
    unique: list[list[int]] = []
    for chain in chains:
        kept = [r for r in chain if r not in seen]
        seen.update(kept)
        if kept:
            unique.append(kept)
    chains = unique
    run = ChainRun(chains)
    out = run.start()
    assert out == [c[0] for c in chains]
    handed: list[int] = list(out)
    sent: dict[int, bool] = {}
    pending = list(out)
    for ok in outcomes:
        if not pending:
            break
        row = pending.pop(0)
        sent[row] = ok
        following = run.settle(row, ok)
        if following is not None:
            pending.append(following)
            handed.append(following)
    for chain in chains:
        went = [r for r in handed if r in chain]
        assert went == chain[: len(went)]  # a prefix, in order
        for before in went[:-1]:
            assert sent.get(before) is True  # the next only after a confirm
        failed = [r for r in went if sent.get(r) is False]
        if failed:
            assert went[-1] == failed[0]  # nothing after a failure
    assert set(run.unattempted()) == {r for c in chains for r in c} - set(handed)
    assert run.done == (not pending)


def test_a_row_settled_twice_or_never_handed_out_is_an_error() -> None:
    run = ChainRun([[1, 2]])
    run.start()
    assert run.settle(1, True) == 2
    with pytest.raises(KeyError):
        run.settle(1, True)
    with pytest.raises(ValueError, match="two chains"):
        ChainRun([[1], [1]])


# --- outcomes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("error", "verdict", "parked"),
    [
        (None, Verdict.SENT, False),
        (MessageUnroutable("returned"), Verdict.REFUSED, False),
        (MessageNacked("nacked"), Verdict.REFUSED, False),
        (NotFound("404 no exchange", 404), Verdict.REFUSED, False),
        (
            PreconditionFailed("406 message size 9 larger than max size 8", 406),
            Verdict.REFUSED,
            False,
        ),
        (UnencodableMessage("priority 300"), Verdict.REFUSED, True),
        (RowUndecodable("not a row"), Verdict.REFUSED, True),
        (PublishFailed("connection lost"), Verdict.LOST, False),
        (BrokerBlocked("blocked"), Verdict.LOST, False),
        (RuntimeError("a bug"), Verdict.LOST, False),
    ],
)
def test_each_publish_outcome_has_one_verdict(
    error: BaseException | None, verdict: Verdict, parked: bool
) -> None:
    assert judge(error) == (verdict, parked)
    result = result_for(7, error, 3, 1.0, 60.0, lambda a, b: b)
    assert (result.verdict, result.parked) == (verdict, parked)
    if verdict is Verdict.REFUSED and not parked:
        assert result.wait == 4.0 and result.error and type(error).__name__ in result.error
    if parked:
        assert result.wait == PARKED


def test_a_refused_row_backs_off_exponentially_within_its_cap() -> None:
    assert [refusal_delay(n, 1.0, 30.0, lambda a, b: b) for n in range(1, 8)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
    ]
    assert refusal_delay(3, 1.0, 30.0, lambda a, b: a) == 2.0  # jitter: at most half off


# --- status ----------------------------------------------------------------------------------
def test_the_status_says_what_needs_a_person() -> None:
    relay = RelaySeen("r", "h", 1, 0.0, 10.0)
    healthy = OutboxStatus(10.0, 3, 3, 0, 0, 0, 1.0, (relay,))
    assert outbox_problems(healthy, "db") == []
    stuck = OutboxStatus(10.0, 5, 2, 1, 2, 1, 300.0, ())
    lines = outbox_problems(stuck, "db", max_age=60, max_failed=0, max_due=1)
    assert len(lines) == 4
    assert "waited 300 s" in lines[0] and "2 row(s) refused" in lines[1]
    assert "2 rows due" in lines[2] and "0 relay(s) running" in lines[3]
    assert outbox_problems(stuck, "db", max_age=None, max_failed=None, min_relays=0) == []
    assert stuck.as_dict()["oldest_due_age"] == 300.0
    assert "pending=5" in stuck.line()


def test_the_schema_exists_for_both_dialects_only() -> None:
    for dialect in ("sqlite", "postgresql"):
        statements = schema(dialect)
        assert any("amqp_lab_outbox (" in s for s in statements)
    assert "CACHE 1" in schema("postgresql")[0] and "AUTOINCREMENT" in schema("sqlite")[0]
    with pytest.raises(ValueError):
        schema("mysql")  # type: ignore[arg-type]


def test_a_chain_deferred_behind_its_keys_earlier_rows_goes_or_is_dropped() -> None:
    """A continuation: rows of a key leased while the key's earlier chain is in flight wait
    for :meth:`ChainRun.resume` (the earlier chain confirmed to its end) or are dropped
    (it failed), and keep their batch open meanwhile."""
    run = ChainRun([[5, 6], [9]])
    assert run.start(defer={5}) == [9]
    assert run.settle(9, True) is None
    assert not run.done  # the deferred chain still holds the batch
    assert run.resume(5) == 5 and run.settle(5, True) == 6 and run.last(6)
    assert run.settle(6, True) is None and run.done
    dropped = ChainRun([[7, 8]])
    assert dropped.start(defer={7}) == [] and not dropped.done
    dropped.drop(7)
    assert dropped.done and sorted(dropped.unattempted()) == [7, 8]


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf, MAX_LOCK_TIMEOUT + 0.001])
def test_a_lock_timeout_postgresql_cannot_take_is_refused(seconds: float, tmp_path: Any) -> None:
    """The relay's lock_timeout must be a positive, finite number of seconds PostgreSQL takes
    (INT_MAX ms), in its config and in the store it opens: ``inf`` raised OverflowError in the
    relay's thread, a larger one was refused by the server at every connection."""
    with pytest.raises(ValueError, match="lock_timeout"):
        RelayConfig(lock_timeout=seconds)
    with pytest.raises(ValueError, match="lock_timeout"):
        OutboxStore(tmp_path / "outbox.sqlite3", lock_timeout=seconds)
    assert not (tmp_path / "outbox.sqlite3").exists()  # refused before any file was made


def test_the_largest_lock_timeout_postgresql_takes_is_accepted() -> None:
    assert RelayConfig(lock_timeout=MAX_LOCK_TIMEOUT).lock_timeout == 2_147_483.647


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("lease", math.inf),
        ("poll", math.nan),
        ("drain_timeout", math.inf),
        ("drain_timeout", -1.0),
        ("idle_exit", -1.0),
        ("publish_timeout", math.inf),
        ("retry_cap", math.inf),
    ],
)
def test_a_relay_setting_in_seconds_must_be_a_finite_time(name: str, value: float) -> None:
    """``lease=inf`` was taken: a PostgreSQL relay's leases never expired, so the rows of a
    relay that died were held for good; an infinite drain_timeout never let a stop end."""
    with pytest.raises(ValueError, match=name):
        RelayConfig(**{name: value})  # type: ignore[arg-type]
    assert RelayConfig(keep_sent=math.inf).keep_sent == math.inf  # sent rows kept for ever
