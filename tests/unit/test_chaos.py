"""The crash test's pure parts: the summary and its invariant, the event plan, the output tally,
and the ledger written through a SQLite store."""

from __future__ import annotations

import json
import random
from contextlib import closing
from pathlib import Path

import pytest

from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.errors import DedupStoreError
from amqp_lab.message import Task
from lab.chaos import (
    Event,
    OutputTally,
    create_ledger,
    invariant_holds,
    ledger_handler,
    plan_events,
    read_ledger,
    summarize,
)

pytestmark = pytest.mark.unit


def test_summary_counts_lost_twice_and_dead_lettered() -> None:
    summary = summarize(
        confirmed=["a", "b", "c", "d", "e"],
        ledger_ids=["a", "b", "b", "c", "x"],  # b twice; x was never confirmed
        dlq_ids=["d", "y"],  # y is not ours
        redeliveries=7,
    )
    assert summary == {
        "published_confirmed": 5,
        "ledger_rows": 5,
        "distinct_ledger_ids": 4,
        "lost": 1,  # e
        "applied_twice": 1,  # b
        "redeliveries_seen": 7,
        "in_dlq": 1,  # d
    }
    assert list(summary) == [
        "published_confirmed",
        "ledger_rows",
        "distinct_ledger_ids",
        "lost",
        "applied_twice",
        "redeliveries_seen",
        "in_dlq",
    ]


def test_the_invariant() -> None:
    clean = summarize(["a", "b"], ["a"], ["b"], redeliveries=1)
    assert (clean["lost"], clean["applied_twice"], invariant_holds(clean)) == (0, 0, True)
    assert invariant_holds(summarize(["a"], ["a"], [], redeliveries=0)) is False  # not exercised
    assert invariant_holds(summarize(["a", "b"], ["a"], [], redeliveries=3)) is False  # b lost
    assert invariant_holds(summarize(["a"], ["a", "a"], [], redeliveries=3)) is False  # twice


def test_event_plan_has_every_event_in_its_range_sorted() -> None:
    events = plan_events(random.Random(4), messages=2000, kills=5, closes=5)
    kinds = sorted(e.kind for e in events)
    assert kinds == ["close-publisher"] * 3 + ["close-worker"] * 2 + ["kill"] * 5
    assert [e.at for e in events] == sorted(e.at for e in events)
    publisher = [e.at for e in events if e.kind == "close-publisher"]
    assert min(publisher) <= 500  # the first one early, surely while publishing
    assert all(100 <= at <= 1800 for at in publisher)
    assert all(100 <= e.at <= 1600 for e in events if e.kind != "close-publisher")
    assert plan_events(random.Random(4), 2000, 5, 5) == events  # a seed replays the plan


def test_event_plan_for_tiny_runs_and_no_chaos() -> None:
    events = plan_events(random.Random(1), messages=1, kills=1, closes=1)
    assert sorted(events, key=lambda e: e.kind) == [Event("close-publisher", 1), Event("kill", 1)]
    assert plan_events(random.Random(1), messages=300, kills=0, closes=0) == []


def test_tally_reads_only_complete_new_lines(tmp_path: Path) -> None:
    out = tmp_path / "worker-1-0.out"
    a = DeliveryReport("a", "processed", 1, False)
    b = DeliveryReport("b", "duplicate", 1, True)
    c = json.dumps(DeliveryReport("c", "processed", 2, True).as_dict())
    out.write_text(
        json.dumps(a.as_dict()) + "\n"
        "some other line\n"
        "{not json\n" + json.dumps(b.as_dict()) + "\n" + c[:20]  # cut short by a SIGKILL, so far
    )
    tally = OutputTally()
    assert tally.update([out, tmp_path / "missing.out"]) == 2
    with out.open("a") as f:
        f.write(c[20:] + "\n")
    assert tally.update([out]) == 3
    assert dict(tally.counts) == {
        "deliveries": 3,
        "outcome:processed": 2,
        "outcome:duplicate": 1,
        "redelivered": 2,
    }


def test_the_ledger_holds_one_row_per_applied_effect(tmp_path: Path) -> None:
    with closing(SqliteDedupStore(tmp_path / "d.sqlite3")) as store:
        create_ledger(store)
        create_ledger(store)  # idempotent
        handler = ledger_handler("run-1", "worker-1")
        for message_id in ("m-1", "m-2", "m-1"):
            task = Task(message_id, {}, {}, "tasks", "task", False, 1)
            store.process_once(message_id, lambda db, t=task: handler(t, db))  # type: ignore[misc]
        store.run_in_transaction(
            lambda db: db.execute("INSERT INTO ledger VALUES ('other-run', 'm-9', 'w', 0)")
        )
        assert sorted(read_ledger(store, "run-1")) == ["m-1", "m-2"]


def test_reading_a_missing_ledger_is_a_dedup_store_error(tmp_path: Path) -> None:
    with (
        closing(SqliteDedupStore(tmp_path / "d.sqlite3")) as store,
        pytest.raises(
            DedupStoreError, match=r"^cannot read the ledger in .*: no such table: ledger$"
        ),
    ):
        read_ledger(store, "run-1")
