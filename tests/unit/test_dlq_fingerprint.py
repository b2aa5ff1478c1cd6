"""DLQ fingerprints: normalised messages, the raising frame, grouping, and the selection a
confirmed console action uses."""

from __future__ import annotations

import traceback
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_lab.dlq.fingerprint import (
    FINGERPRINT_CHARS,
    Fingerprint,
    fingerprint_of,
    group,
    normalise_message,
    selects,
    top_frame,
)
from amqp_lab.dlq.record import RECORD_TYPE, build_record, record_message
from amqp_lab.dlq.view import DlqEntry, view_of
from amqp_lab.message import encode_json

pytestmark = pytest.mark.unit


def entry(
    message: str,
    error_type: str = "RuntimeError",
    *,
    message_id: str | None = "m-1",
    tb: str | None = None,
    first: str | None = "2026-01-01T10:00:00.000Z",
    last: str | None = "2026-01-01T10:05:00.000Z",
    queue: str | None = "q:tasks",
) -> DlqEntry:
    return DlqEntry(
        message_id=message_id,
        source="record",
        error_type=error_type,
        error_message=message,
        classification="unknown",
        attempts=1,
        first_seen_at=first,
        last_failed_at=last,
        exchange="tasks",
        routing_key="task",
        payload={"n": 1},
        payload_encoding="json",
        headers={},
        traceback=tb,
        queue=queue,
    )


def raised_in_inner() -> str:
    def inner() -> None:
        raise ValueError("boom 7")

    try:
        inner()
    except ValueError as e:
        return "".join(traceback.format_exception(e))
    raise AssertionError("unreachable")


# --- normalise_message ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("message", "normalised"),
    [
        ("order 42 failed", "order <n> failed"),
        ("order -4.5e3 failed", "order <n> failed"),
        ("customer 'c-77' not found", "customer <str> not found"),
        ('no key "x y" in table', "no key <str> in table"),
        ("can't reach the service", "can't reach the service"),
        ("request 7f3a9c2e timed out", "request <hex> timed out"),
        ("at 0xDEADbeef", "at <hex>"),
        ("job 9b2e4f1a-1234-4321-abcd-0123456789ab", "job <uuid>"),
        ("since 2026-01-01T10:00:00.123Z", "since <time>"),
        ("mail bob.smith+x@example.co.uk bounced", "mail <email> bounced"),
        ("  spaced \n  out\t", "spaced out"),
        ("", ""),
    ],
)
def test_normalise_message(message: str, normalised: str) -> None:
    assert normalise_message(message) == normalised


def test_the_records_own_message_id_becomes_a_placeholder() -> None:
    assert normalise_message("order-abc-x failed", "order-abc-x") == "<message_id> failed"
    assert normalise_message("7 failed", "7") == "<n> failed"  # too short to be replaced as such


_WORDS = st.lists(st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8), max_size=5)
_NUMBERS = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
)


@settings(database=None, max_examples=200)
@given(
    before=_WORDS,
    after=_WORDS,
    numbers=st.lists(st.tuples(_NUMBERS, _NUMBERS), min_size=1, max_size=3),
)
def test_numbers_in_messages_never_split_a_group(
    before: list[str], after: list[str], numbers: list[tuple[float, float]]
) -> None:
    def message(values: list[float]) -> str:
        return " ".join([*before, *(str(v) for v in values), *after])

    first = entry(message([a for a, _ in numbers]), message_id="m-1")
    second = entry(message([b for _, b in numbers]), message_id="m-2")
    assert fingerprint_of(first) == fingerprint_of(second)
    (only,) = group([first, second])
    assert only.count == 2


@settings(database=None)
@given(
    types=st.lists(st.text(min_size=1, max_size=20), min_size=2, max_size=6, unique=True),
    message=st.text(max_size=40),
)
def test_different_error_types_never_merge(types: list[str], message: str) -> None:
    groups = group(entry(message, t) for t in types)
    assert sorted(g.error_type for g in groups) == sorted(types)
    assert len({g.id for g in groups}) == len(types)


# --- top_frame -----------------------------------------------------------------------------
def test_top_frame_is_where_the_exception_was_raised() -> None:
    assert top_frame(raised_in_inner()) == "unit/test_dlq_fingerprint.py in inner"


def test_top_frame_of_a_chained_exception_is_the_last_raised() -> None:
    def outer() -> None:
        try:
            raise KeyError("k")
        except KeyError as e:
            raise RuntimeError("wrapped") from e

    try:
        outer()
    except RuntimeError as e:
        text = "".join(traceback.format_exception(e))
    assert "KeyError" in text
    assert top_frame(text) == "unit/test_dlq_fingerprint.py in outer"


def test_top_frame_has_no_line_number_and_no_install_prefix() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/.venv/lib/python3.12/site-packages/shop/orders.py", line 88, in place\n'
        "    charge(order)\n"
        "ValueError: boom\n"
    )
    assert top_frame(text) == "shop/orders.py in place"
    moved = text.replace("line 88", "line 91")
    assert fingerprint_of(entry("boom", tb=text)) == fingerprint_of(entry("boom", tb=moved))


def test_the_same_bug_from_two_release_directories_is_one_group() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/srv/releases/41/app/orders.py", line 88, in place\n'
        "ValueError: boom\n"
    )
    newer = text.replace("/releases/41/", "/releases/42/")
    assert top_frame(text) == top_frame(newer) == "app/orders.py in place"
    assert len(group([entry("boom", tb=text), entry("boom", tb=newer)])) == 1


def test_no_traceback_no_frame() -> None:
    assert top_frame(None) is None
    assert top_frame("") is None
    assert top_frame("ValueError: no frames here") is None


def test_a_different_raising_frame_is_another_group() -> None:
    here = raised_in_inner()
    elsewhere = here.replace(" in inner", " in other")
    assert len(group([entry("boom", tb=here), entry("boom", tb=elsewhere)])) == 2


# --- Fingerprint and group -----------------------------------------------------------------
def test_the_fingerprint_id_is_short_hex_and_stable() -> None:
    fp = Fingerprint("RuntimeError", "order <n> failed", None)
    assert len(fp.id) == FINGERPRINT_CHARS
    assert int(fp.id, 16) >= 0
    assert fp.id == "dcf6f0db9147"  # the same in every process and version: URLs stay valid


def test_group_counts_times_and_queues() -> None:
    entries = [
        entry("order 1 failed", first="2026-01-01T10:00:00.000Z", last="2026-01-01T11:00:00.000Z"),
        entry("order 2 failed", "KeyError", last="2026-01-02T09:00:00.000Z"),
        entry(
            "order 3 failed",
            first="2026-01-01T09:00:00.000Z",
            last="2026-01-01T12:00:00.000Z",
            queue="q:other",
        ),
        entry("order 4 failed", first=None, last="2026-01-01T08:00:00.000Z", queue=None),
    ]
    runtime, key_error = group(entries)
    assert (runtime.error_type, runtime.message, runtime.count) == (
        "RuntimeError",
        "order <n> failed",
        3,
    )
    assert runtime.first_seen == "2026-01-01T08:00:00.000Z"  # no first_seen_at: its failure
    assert runtime.last_seen == "2026-01-01T12:00:00.000Z"
    assert runtime.queues == ("q:other", "q:tasks")
    assert [e.error_message for e in runtime.entries] == [
        "order 1 failed",
        "order 3 failed",
        "order 4 failed",
    ]
    assert key_error.count == 1 and key_error.top_frame is None


def test_groups_largest_first_then_seen_last() -> None:
    entries = [
        entry("a", "A", last="2026-01-01T10:00:00.000Z"),
        entry("b", "B", last="2026-01-03T10:00:00.000Z"),
        entry("c", "C", last="2026-01-02T10:00:00.000Z"),
        entry("c", "C", last="2026-01-02T10:00:00.000Z"),
    ]
    assert [g.error_type for g in group(entries)] == ["C", "B", "A"]


def test_unreadable_times_are_ignored() -> None:
    (only,) = group([entry("x", first="yesterday", last=None)])
    assert (only.first_seen, only.last_seen) == (None, None)


def test_group_of_nothing() -> None:
    assert group([]) == []


# --- selects -------------------------------------------------------------------------------
def test_selects_needs_the_message_id_and_the_fingerprint() -> None:
    one = entry("order 1 failed", message_id="m-1")
    fp = fingerprint_of(one).id
    assert selects(fp, ["m-1"])(one)
    assert not selects(fp, ["m-2"])(one)
    changed = replace(one, error_type="KeyError")  # failed again, differently
    assert not selects(fp, ["m-1"])(changed)
    assert selects(fp)(replace(one, message_id="m-9"))  # the whole group
    assert not selects(fp, [])(one)


# --- what a DlqEntry carries for grouping --------------------------------------------------
def _props(**fields: Any) -> SimpleNamespace:
    names = ("message_id", "type", "headers", "content_type", "priority")
    return SimpleNamespace(**{name: fields.get(name) for name in names})


def test_a_record_names_its_queue_and_keeps_its_x_death() -> None:
    record = build_record(
        body=encode_json({"n": 1}),
        message_id="m-1",
        exchange="tasks",
        routing_key="task",
        queue="q:tasks",
        properties={},
        headers={"x-death": [{"count": 2, "reason": "expired", "queue": "q:tasks:wait:1"}]},
        error=RuntimeError("boom"),
        classification="unknown",
        attempts=3,
        first_seen_at="2026-01-01T10:00:00.000Z",
        failed_at=0,
    )
    message = record_message(record, "tasks.dlx", "task")
    seen = view_of(message.body, _props(type=RECORD_TYPE))
    assert seen.queue == "q:tasks"
    assert seen.x_death == [{"count": 2, "reason": "expired", "queue": "q:tasks:wait:1"}]
    assert top_frame(seen.traceback) is None  # never raised: a traceback without frames


def test_a_raw_message_names_the_queue_of_its_latest_death() -> None:
    deaths = [{"count": 1, "reason": b"rejected", "queue": b"q:tasks"}]
    seen = view_of(b"x", _props(message_id="m-2", headers={"x-death": deaths}))
    assert seen.queue == "q:tasks"
    assert seen.x_death == deaths
    assert view_of(b"x", _props(message_id="m-3")).queue is None
