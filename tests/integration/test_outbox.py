"""The outbox on a real broker and a real database (SQLite and PostgreSQL): a message is
published if and only if its transaction committed, exactly as written, scheduled ones not
before their time, cancelled ones never; a key's rows in commit order; a row the broker refuses
holds its key only, and an operator retries or discards it; hostile rows are parked with their
reason; a relay that dies holding a lease delays its rows, it does not lose them."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from amqp_lab.connection import open_channel
from amqp_lab.dedup.handler_db import HandlerDb
from amqp_lab.errors import OutboxError, OutboxUnavailable, UnencodableMessage
from amqp_lab.fieldtable import TaggedInt
from amqp_lab.message import message_for
from amqp_lab.outbox import CancelResult, add, cancel, create_schema
from amqp_lab.outbox.leasing import LEASE_ROUNDS, LeaseQueries
from amqp_lab.outbox.observer import RelayConfig, RelayReport
from amqp_lab.outbox.outcomes import PARKED, RowResult, Verdict
from amqp_lab.outbox.relay import OutboxRelay
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings
from tests.amqp_values import same
from tests.brokers import TestBroker
from tests.pgsupport import temp_database
from tests.support import NAMES, get_all, run_script, strict_json, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture(params=["sqlite", "postgresql"])
def outbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty outbox: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        url = str(tmp_path / "app.sqlite3")
        OutboxStore(url).close()
        yield url
    else:
        with temp_database() as url:
            OutboxStore(url).close()
            yield url


def connect(url: str) -> Any:
    """The application's own connection to the outbox's database."""
    if url.startswith("postgresql://"):
        return psycopg.connect(url)
    return sqlite3.connect(url)


@contextmanager
def transaction(db: Any) -> Iterator[Any]:
    """One transaction on the application's connection: committed, or rolled back on an
    exception (psycopg's ``with connection`` would also close it)."""
    try:
        yield db
    except BaseException:
        db.rollback()
        raise
    db.commit()


def relay_until_idle(settings: BrokerSettings, url: str, **config: Any) -> list[RelayReport]:
    reports: list[RelayReport] = []
    options: dict[str, Any] = {"idle_exit": 1.0, "poll": 0.1} | config
    OutboxRelay(settings, url, RelayConfig(**options), on_report=reports.append).run()
    return reports


def ids_in(settings: BrokerSettings, queue: str = "q:tasks") -> list[str]:
    return [p.message_id for _, p, _ in get_all(settings, queue)]


def test_a_message_is_published_if_and_only_if_its_transaction_committed(
    topology: BrokerSettings, outbox: str
) -> None:
    headers: dict[str, Any] = {
        "decimal": Decimal("12.50"),
        "when": datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
        "nested": {"list": [1, b"\x00\xff", None], "byte": TaggedInt(7, "b")},
        "text": "ünïcödé",
    }
    db = connect(outbox)
    with transaction(db):
        db.execute("CREATE TABLE orders (id TEXT)")
        db.execute("INSERT INTO orders VALUES ('o-1')")
        kept = message_for(NAMES, {"order": "o-1"}, message_id="o-1-created", headers=headers)
        assert add(db, kept, notify=True) is True
        assert add(db, message_for(NAMES, {"again": 1}, message_id="o-1-created")) is False
        add(db, message_for(NAMES, {"n": 2}, message_id="o-1-second", priority=3))
    with pytest.raises(RuntimeError), transaction(db):
        db.execute("INSERT INTO orders VALUES ('o-2')")
        add(db, message_for(NAMES, {"order": "o-2"}, message_id="o-2-created"))
        raise RuntimeError("the business transaction fails")
    reports = relay_until_idle(topology, outbox)
    assert sorted((r.message_id, r.outcome, r.tries) for r in reports) == [
        ("o-1-created", "sent", 1),
        ("o-1-second", "sent", 1),
    ]
    got = {p.message_id: (p, body) for _, p, body in get_all(topology, "q:tasks")}
    assert sorted(got) == ["o-1-created", "o-1-second"]
    properties, body = got["o-1-created"]
    assert body == kept.body
    # RabbitMQ 4.3 may hand the top-level headers back sorted by name: compare them as a table
    assert same(dict(sorted(properties.headers.items())), dict(sorted(headers.items())))
    assert (properties.delivery_mode, properties.content_type) == (2, "application/json")
    assert got["o-1-second"][0].priority == 3
    assert OutboxStore(outbox).status().pending == 0  # sent rows are deleted
    db.close()


def test_a_message_id_holding_a_nul_is_refused_by_add_and_not_found_by_cancel(outbox: str) -> None:
    """PostgreSQL text cannot hold a NUL: add refuses it before any statement, on either
    database, so the caller's transaction goes on; cancel finds no such row."""
    db = connect(outbox)
    with transaction(db):
        with pytest.raises(UnencodableMessage, match="NUL character"):
            add(db, message_for(NAMES, {"n": 1}, message_id="m-\x00"))
        assert add(db, message_for(NAMES, {"n": 2}, message_id="m-2")) is True
    with transaction(db):
        assert cancel(db, "m-\x00") is CancelResult.NOT_FOUND
        assert cancel(db, "m-\udc80") is CancelResult.NOT_FOUND  # before: UnicodeEncodeError
        assert cancel(db, "m-2") is CancelResult.CANCELLED
    db.close()


class Row:  # what an application's row factory makes: nothing our statements' columns fit
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "tries" not in kwargs:
            raise TypeError("not a row of ours")


def app_rows(url: str, kind: str) -> Any:
    """The application's connection, its rows dicts or objects of its own."""
    if url.startswith("postgresql://"):
        factory = psycopg.rows.dict_row if kind == "dict" else psycopg.rows.kwargs_row(Row)
        return psycopg.connect(url, row_factory=factory)
    db = sqlite3.connect(url)
    if kind == "dict":
        db.row_factory = lambda cursor, row: dict(
            zip([d[0] for d in cursor.description], row, strict=True)
        )
    else:
        db.row_factory = lambda cursor, row: Row(
            **{d[0]: v for d, v in zip(cursor.description, row, strict=True)}
        )
    return db


@pytest.mark.parametrize("kind", ["dict", "object"])
def test_the_writer_works_whatever_rows_the_connection_makes(outbox: str, kind: str) -> None:
    """An application whose connection makes dict rows or objects: before, cancel read
    ``row[0]`` and raised KeyError (or the factory's TypeError) after its DELETE had run (a
    commit then cancelled the row anyway), and create_schema failed. The outbox's statements
    now read tuples whatever the connection makes."""
    db = app_rows(outbox, kind)
    with transaction(db):
        create_schema(db)  # the tables are there: found in the catalog, not created again
        assert add(db, message_for(NAMES, {"n": 1}, message_id="m-1"), due_at=time.time() + 60)
        assert add(db, message_for(NAMES, {"n": 2}, message_id="m-2"))
        assert not add(db, message_for(NAMES, {"n": 2}, message_id="m-2"))
    with transaction(db):
        assert cancel(db, "m-1") is CancelResult.CANCELLED
        assert cancel(db, "m-1") is CancelResult.NOT_FOUND
    db.close()
    assert OutboxStore(outbox).status().pending == 1


def test_add_in_a_psycopg_pipeline_says_what_it_did() -> None:
    """In pipeline mode a statement's rowcount is -1 until the pipeline syncs: add said False
    (already there) for a row it had written, and a missing table failed only at the end of
    the block, as a raw driver error. Now add reads its result, which waits for it."""
    with temp_database() as url:
        with psycopg.connect(url) as db:
            with db.pipeline(), pytest.raises(OutboxError, match="does not exist"):
                add(db, message_for(NAMES, {"n": 0}, message_id="m-0"))
            db.rollback()
            create_schema(db)
            with db.pipeline():
                assert add(db, message_for(NAMES, {"n": 1}, message_id="m-1")) is True
                assert add(db, message_for(NAMES, {"n": 1}, message_id="m-1")) is False
                assert add(db, message_for(NAMES, {"n": 2}, message_id="m-2")) is True
            db.commit()
        assert OutboxStore(url).status().pending == 2


def test_scheduled_messages_wait_for_their_time_and_survive_a_relay_restart(
    topology: BrokerSettings, outbox: str
) -> None:
    db = connect(outbox)
    due = time.time() + 2.5
    with transaction(db):
        add(db, message_for(NAMES, {"n": 1}, message_id="now"))
        add(db, message_for(NAMES, {"n": 2}, message_id="later"), due_at=due)
        add(db, message_for(NAMES, {"n": 3}, message_id="cancelled"), due_at=due)
    with transaction(db):
        assert cancel(db, "cancelled") is CancelResult.CANCELLED
    assert [r.message_id for r in relay_until_idle(topology, outbox, idle_exit=0.5)] == ["now"]
    assert time.time() < due and ids_in(topology) == ["now"]  # the relay stopped before
    sent_at: dict[str, float] = {}

    def sent(report: RelayReport) -> None:
        sent_at.setdefault(report.message_id, time.time())

    relay = OutboxRelay(topology, outbox, RelayConfig(poll=0.1), on_report=sent)
    relay.start_thread()
    try:
        wait_for(lambda: "later" in sent_at, timeout=15, what="the scheduled row sent")
    finally:
        relay.stop()
        relay.join(20)
    assert sent_at["later"] >= due
    assert ids_in(topology) == ["later"]
    with transaction(db):
        assert cancel(db, "later") is CancelResult.NOT_FOUND  # sent and deleted
    db.close()


def test_a_key_is_written_by_one_transaction_at_a_time_so_its_ids_are_in_commit_order(
    topology: BrokerSettings,
) -> None:
    """PostgreSQL numbers rows at insert, so a transaction that inserts first and commits
    last would get the smaller id. add() holds the key's advisory lock until the commit: the
    second writer of the key waits for the first one's end; other keys do not wait."""
    with temp_database() as url:
        OutboxStore(url).close()
        first, second, other = psycopg.connect(url), psycopg.connect(url), psycopg.connect(url)
        add(first, message_for(NAMES, {"n": 1}, message_id="k-first"), key="k")
        done: dict[str, float] = {}

        def write_second() -> None:
            add(second, message_for(NAMES, {"n": 2}, message_id="k-second"), key="k")
            done["second"] = time.monotonic()
            second.commit()

        writer = threading.Thread(target=write_second)
        writer.start()
        add(other, message_for(NAMES, {"n": 3}, message_id="j-other"), key="j")
        other.commit()  # another key never waits
        time.sleep(1.0)
        assert "second" not in done  # k's second writer waits for the first
        committed = time.monotonic()
        first.commit()
        writer.join(10)
        assert done["second"] >= committed
        reports = relay_until_idle(topology, url)
        assert [r.message_id for r in reports if r.key == "k"] == ["k-first", "k-second"]
        queued = ids_in(topology)
        assert queued.index("k-first") < queued.index("k-second")
        for connection in (first, second, other):
            connection.close()


def test_a_row_the_broker_refuses_holds_only_its_key_until_retried_or_discarded(
    topology: BrokerSettings, outbox: str
) -> None:
    with open_channel(topology) as channel:
        channel.exchange_declare("nowhere", "direct", durable=True)
        channel.queue_declare("q:nowhere", durable=True)
    db = connect(outbox)
    with transaction(db):
        bad = message_for(NAMES, {"n": 1}, message_id="k-1-unroutable")
        add(db, replace(bad, exchange="nowhere"), key="k")
        add(db, message_for(NAMES, {"n": 2}, message_id="k-2"), key="k")
        add(db, message_for(NAMES, {"n": 3}, message_id="j-1"), key="j")
        gone = message_for(NAMES, {"n": 4}, message_id="m-1-unroutable")
        add(db, replace(gone, exchange="nowhere"), key="m")
        add(db, message_for(NAMES, {"n": 5}, message_id="m-2"), key="m")
    db.close()
    args = ("--outbox-url", outbox, "--idle-exit", "1.5", "--poll", "0.1")
    first = run_script(topology, "relay.py", *args)
    assert first.returncode == 0, first.stdout + first.stderr
    outcomes = {line.split()[0]: line for line in first.stdout.splitlines() if "outcome=" in line}
    assert "outcome=sent" in outcomes["message_id=j-1"]
    assert "outcome=refused" in outcomes["message_id=k-1-unroutable"]
    assert "MessageUnroutable" in outcomes["message_id=k-1-unroutable"]
    assert "message_id=k-2" not in outcomes and "message_id=m-2" not in outcomes
    assert "refused" in first.stderr and "k-1-unroutable" in first.stderr  # reported
    status = run_script(topology, "relay.py", "status", "--outbox-url", outbox, "--json")
    assert status.returncode == 0, status.stderr
    data = strict_json(status.stdout)
    assert (data["pending"], data["failed"], data["parked"]) == (4, 2, 0)
    refused = {r["message_id"]: r for r in data["refused"]}
    assert set(refused) == {"k-1-unroutable", "m-1-unroutable"}
    assert refused["k-1-unroutable"]["last_error"].startswith("MessageUnroutable")
    # the operator fixes k's cause (a binding) and retries it, and gives up on m's message
    with open_channel(topology) as channel:
        channel.queue_bind("q:nowhere", "nowhere", NAMES.routing_key)
    retried = run_script(topology, "relay.py", "retry", "--outbox-url", outbox, "--all")
    assert "2 refused row(s) due again" in retried.stdout, retried.stdout + retried.stderr
    discarded = run_script(
        topology, "relay.py", "discard", "--outbox-url", outbox, "--message-id", "m-1-unroutable"
    )
    assert strict_json(discarded.stdout)["discarded"]["message_id"] == "m-1-unroutable"
    nothing = run_script(
        topology, "relay.py", "discard", "--outbox-url", outbox, "--message-id", "m-1-unroutable"
    )
    assert nothing.returncode == 1 and nothing.stderr.startswith("error: no refused row")
    second = run_script(topology, "relay.py", *args)
    sent = [line.split()[0] for line in second.stdout.splitlines() if "outcome=sent" in line]
    assert sent.index("message_id=k-1-unroutable") < sent.index("message_id=k-2")
    assert set(sent) == {"message_id=k-1-unroutable", "message_id=k-2", "message_id=m-2"}
    assert ids_in(topology, "q:nowhere") == ["k-1-unroutable"]
    assert sorted(ids_in(topology)) == ["j-1", "k-2", "m-2"]


def test_a_row_larger_than_the_broker_takes_is_refused_and_the_rest_flows(
    broker: TestBroker, topology: BrokerSettings, outbox: str
) -> None:
    db = connect(outbox)
    with transaction(db):
        add(db, message_for(NAMES, b"x" * 50_000, message_id="k-big"), key="k")
        add(db, message_for(NAMES, {"n": 2}, message_id="k-after"), key="k")
        for n in range(5):
            add(db, message_for(NAMES, {"n": n}, message_id=f"free-{n}"))
    db.close()
    with broker.max_message_size(10_000):
        reports = relay_until_idle(topology, outbox)
    by_id = {r.message_id: r for r in reports}
    assert by_id["k-big"].outcome == "refused" and "PreconditionFailed" in (
        by_id["k-big"].error or ""
    )
    assert "k-after" not in by_id
    assert sorted(ids_in(topology)) == [f"free-{n}" for n in range(5)]
    (failed,) = OutboxStore(outbox).failed()
    assert failed.message_id == "k-big" and failed.retry_at is not None  # tried again later


def test_hostile_rows_are_parked_with_their_reason_and_block_nothing_else(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Rows written by hand (or by another version) that are no message: the relay parks
    each with the reason and relays the rest; SQLite's loose typing lets a column hold
    anything."""
    url = str(tmp_path / "app.sqlite3")
    OutboxStore(url).close()
    db = sqlite3.connect(url)
    columns = (
        "message_id, ordering_key, exchange, routing_key, properties, headers, body, "
        "created_at, available_at"
    )
    hostile = [
        ("bad-json", "{not json", b"\x00\x00\x00\x00", b"{}"),
        ("bad-headers", "{}", b"\x00\x00\x00\x09garbage!!", b"{}"),
        ("text-body", "{}", b"\x00\x00\x00\x00", "not bytes"),
        ("nan-priority", '{"priority": NaN}', b"\x00\x00\x00\x00", b"{}"),
    ]
    with transaction(db):
        for message_id, properties, headers, body in hostile:
            db.execute(
                f"INSERT INTO amqp_lab_outbox ({columns}) VALUES (?, 'k-' || ?, 'tasks', 'task', "
                "?, ?, ?, 0, 0)",
                (message_id, message_id, properties, headers, body),
            )
        add(db, message_for(NAMES, {"n": 1}, message_id="fine"))
    db.close()
    reports = {r.message_id: r for r in relay_until_idle(topology, url)}
    assert reports["fine"].outcome == "sent" and ids_in(topology) == ["fine"]
    for message_id, *_ in hostile:
        assert reports[message_id].outcome == "refused"
        assert "RowUndecodable" in (reports[message_id].error or "")
    status = OutboxStore(url).status()
    assert (status.failed, status.parked) == (4, 4)


def test_text_that_is_not_utf8_parks_its_row_and_every_tool_still_reads_the_outbox(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """SQLite stores whatever bytes a program gives it as TEXT. Before, one value that was
    not UTF-8 failed every read of its row ("Could not decode to UTF-8 column ...": every
    lease, so the relay stopped and sent nothing; the status too); now the row is parked with
    the reason, its key's later rows wait behind it, the rest go, and the status shows it."""
    url = str(tmp_path / "app.sqlite3")
    OutboxStore(url).close()
    db = sqlite3.connect(url)
    columns = "message_id, ordering_key, exchange, routing_key, properties, traceparent"
    good = ("'tasks'", "'task'", "'{}'", "NULL")
    bad = "CAST(x'ff' AS TEXT)"
    cases = {  # message_id: the other columns' SQL, one of them not UTF-8
        "bad-key": ("CAST(x'6bff' AS TEXT)", *good),
        "bad-exchange": ("'k-e'", bad, *good[1:]),
        "bad-routing-key": ("'k-r'", good[0], bad, *good[2:]),
        "bad-properties": ("'k-p'", *good[:2], bad, "NULL"),
        "bad-traceparent": ("'k-t'", *good[:3], bad),  # a trace context lost, the message not
    }
    with transaction(db):
        for message_id, values in cases.items():
            db.execute(
                f"INSERT INTO amqp_lab_outbox ({columns}, headers, body, created_at, available_at)"
                f" VALUES (?, {', '.join(values)}, x'00000000', x'7b7d', 0, 0)",
                (message_id,),
            )
        db.execute(  # behind the bad key's head, on the same stored bytes
            f"INSERT INTO amqp_lab_outbox ({columns}, headers, body, created_at, available_at)"
            f" VALUES ('behind-bad-key', CAST(x'6bff' AS TEXT), {', '.join(good)},"
            " x'00000000', x'7b7d', 0, 0)"
        )
        db.execute(
            f"INSERT INTO amqp_lab_outbox ({columns}, headers, body, created_at, available_at)"
            f" VALUES ({bad}, 'k-m', {', '.join(good)}, x'00000000', x'7b7d', 0, 0)"
        )
        add(db, message_for(NAMES, {"n": 1}, message_id="fine"))
    db.close()
    reports = {r.message_id: r for r in relay_until_idle(topology, url)}
    assert sorted(ids_in(topology)) == ["bad-traceparent", "fine"]
    refused = {m for m, r in reports.items() if r.outcome == "refused"}
    shown = {str(m) for m in refused}  # the bad message_id's text, as the status shows it
    assert shown == {"bad-key", "bad-exchange", "bad-routing-key", "bad-properties", "\ufffd"}
    assert all("not UTF-8 text" in (reports[m].error or "") for m in refused)
    assert "behind-bad-key" not in reports  # its key's head is parked: it waits
    status = run_script(topology, "relay.py", "status", "--outbox-url", url, "--json")
    assert status.returncode == 0, status.stderr
    data = strict_json(status.stdout)
    assert (data["pending"], data["failed"], data["parked"]) == (6, 5, 5)
    assert {r["message_id"] for r in data["refused"]} == shown


def test_a_key_that_is_not_utf8_holds_back_only_its_own_backlog_and_its_head_can_go(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """A key that is not UTF-8, and one that is an integer (SQLite's loose typing), each with a
    parked head and more due rows behind it than a lease's window, older than the rest: the
    relay sends every other key's rows. Before, the lease skipping such a key bound its str()
    - U+FFFD text, "7" - which matched none of its rows: it found the same window every round
    and sent nothing at all. The operator then discards the parked head by the message_id the
    status shows (before: "no refused row"), and its key's next row is parked in turn and
    retried by that text."""
    url = str(tmp_path / "app.sqlite3")
    OutboxStore(url).close()
    db = sqlite3.connect(url)
    columns = "message_id, ordering_key, exchange, routing_key, properties, headers, body"
    parked = ", last_error, refused_at, created_at, available_at) VALUES"
    with transaction(db):
        for n in range(40):  # the key's head, parked as a relay parks it, and 39 rows behind it
            db.execute(
                f"INSERT INTO amqp_lab_outbox ({columns}{parked} (CAST(? || x'ff' AS TEXT),"
                " CAST(x'6bff' AS TEXT), 'tasks', 'task', '{}', x'00000000', x'7b7d', ?, 0, 0, ?)",
                (f"b{n}-", "RowUndecodable" if n == 0 else None, 1e308 if n == 0 else 0),
            )
        for n in range(40):  # by hand, an integer key: a parked head and 39 rows behind it
            db.execute(
                f"INSERT INTO amqp_lab_outbox ({columns}{parked} (?, 7, 'tasks', 'task', '{{}}',"
                " x'00000000', x'7b7d', ?, 0, 0, ?)",
                (f"i{n}", "RowUndecodable" if n == 0 else None, 1e308 if n == 0 else 0),
            )
        for n in range(12):
            add(db, message_for(NAMES, {"n": n}, message_id=f"fine-{n}"), key=f"k{n % 3}")
    db.close()
    relay_until_idle(topology, url, batch_rows=5)
    assert sorted(ids_in(topology)) == sorted(f"fine-{n}" for n in range(12))
    store = OutboxStore(url)
    assert [f.message_id for f in store.failed()] == ["b0-\ufffd", "i0"]
    assert store.status().pending == 80
    store.close()
    discard = ("discard", "--outbox-url", url, "--message-id", "b0-\ufffd")
    done = run_script(topology, "relay.py", *discard)
    assert done.returncode == 0, done.stdout + done.stderr
    relay_until_idle(topology, url, batch_rows=5)
    store = OutboxStore(url)
    assert [f.message_id for f in store.failed()] == ["b1-\ufffd", "i0"]  # b's next, parked
    assert store.status().pending == 79
    store.close()
    retry = ("retry", "--outbox-url", url, "--message-id", "b1-\ufffd")
    retried = run_script(topology, "relay.py", *retry)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.startswith("1 refused row(s) due again")  # before: 0


def test_a_hostile_heartbeat_counts_as_no_relay_and_the_status_still_reads(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Heartbeat rows written by hand: a seen_at that is text or NaN (SQLite compares text
    above every number) or an hour ahead counted as a live relay for ever; a pid that was no
    number failed the status with ValueError."""
    url = str(tmp_path / "app.sqlite3")
    store = OutboxStore(url)
    now = store.now()
    store.heartbeat("real", now)
    db = sqlite3.connect(url)
    with transaction(db):
        for row in [
            ("nan", "h", 1, 0, "NaN"),
            ("text", "h", 1, 0, "yesterday"),
            ("ahead", "h", 1, 0, now + 3600),
            ("odd-pid", "h", "abc", "x", now),
        ]:
            db.execute("INSERT INTO amqp_lab_outbox_relays VALUES (?, ?, ?, ?, ?)", row)
    db.close()
    seen = {r.relay_id: r for r in store.status().relays}
    store.close()
    assert set(seen) == {"real", "odd-pid"} and (
        seen["odd-pid"].pid,
        seen["odd-pid"].started_at,
    ) == (0, 0.0)
    status = run_script(topology, "relay.py", "status", "--outbox-url", url, "--json")
    assert status.returncode == 0, status.stderr
    assert {r["relay_id"] for r in strict_json(status.stdout)["relays"]} == {"real", "odd-pid"}


def test_a_relay_that_dies_holding_a_lease_delays_its_rows_and_loses_none(
    topology: BrokerSettings, outbox: str
) -> None:
    """PostgreSQL: the lease expires (here after 2 s) and another relay takes the rows, as a
    second try; SQLite: the next relay to take the lock file knows the last holder is gone and
    takes them at once."""
    db = connect(outbox)
    with transaction(db):
        for n in range(3):
            add(db, message_for(NAMES, {"n": n}, message_id=f"k-{n}"), key="k")
    db.close()
    dead = OutboxStore(outbox)
    seconds = 2.0 if outbox.startswith("postgresql") else 3600.0
    lease = dead.lease("a-relay-that-died", seconds, 10, 10**6)
    assert len(lease.rows) == 3
    dead.close()
    started = time.monotonic()
    reports = relay_until_idle(topology, outbox, idle_exit=3.0)
    assert [(r.message_id, r.tries) for r in reports] == [(f"k-{n}", 2) for n in range(3)]
    assert ids_in(topology) == ["k-0", "k-1", "k-2"]
    if outbox.startswith("postgresql"):
        assert time.monotonic() - started >= 1.5  # waited for the lease to expire


def test_a_relay_crosses_more_held_back_keys_than_one_lease_looks_past(
    topology: BrokerSettings, outbox: str
) -> None:
    """Ten keys, each with a parked head and more due rows behind it than a lease's window
    holds (batches of 2: a window of 4 on SQLite, 3 on PostgreSQL), all older than key z's
    one row. A lease crosses LEASE_ROUNDS (8) such keys; the relay leases again at once,
    skipping them, instead of starting over at the first window after its poll - which
    never reached z."""
    assert LEASE_ROUNDS < 10

    def write(*names: tuple[str, str]) -> None:
        db = connect(outbox)
        with transaction(db):
            for message_id, key in names:
                add(db, message_for(NAMES, {}, message_id=message_id), key=key)
        db.close()

    write(*((f"b{k}-0", f"b{k}") for k in range(10)))
    store = OutboxStore(outbox)
    try:
        heads = store.lease("an-operator", 30, 10, 10**6)
        assert sorted(r.message_id for r in heads.rows.values()) == [f"b{k}-0" for k in range(10)]
        parked = [RowResult(r, Verdict.REFUSED, "x", PARKED) for r in heads.rows]
        store.complete("an-operator", parked, False)
    finally:
        store.close()
    write(*((f"b{k}-{n}", f"b{k}") for k in range(10) for n in range(1, 6)))
    write(("z", "z"))
    reports = relay_until_idle(topology, outbox, batch_rows=2)
    assert [(r.message_id, r.outcome) for r in reports] == [("z", "sent")]
    assert ids_in(topology) == ["z"]


def test_a_lease_that_fails_part_way_leaves_no_rows_leased_to_the_relay(
    topology: BrokerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a relay's session runs each statement of a lease as its own transaction,
    so when the database fails after the heads were leased (here: reading their keys' next
    rows), those heads stay leased to the relay. It releases them before its next lease -
    without that they waited for their lease to expire (30 s), and the relay sat idle."""
    followers = LeaseQueries._followers
    failures: list[int] = []

    def fails_once(self: LeaseQueries, *args: Any) -> Any:
        if not failures:
            failures.append(1)
            raise OutboxUnavailable("the server closed the connection")
        return followers(self, *args)

    monkeypatch.setattr(LeaseQueries, "_followers", fails_once)
    with temp_database() as url:
        OutboxStore(url).close()
        db = connect(url)
        with transaction(db):
            for n in range(8):
                add(db, message_for(NAMES, {"n": n}, message_id=f"m{n}"), key=f"k{n % 4}")
        db.close()
        reports = relay_until_idle(topology, url, lease=30.0)
        assert failures == [1]
        assert sorted(r.message_id for r in reports if r.outcome == "sent") == [
            f"m{n}" for n in range(8)
        ]
        assert OutboxStore(url).status().pending == 0


def test_the_relay_command_says_what_it_does_and_refuses_in_one_line(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    schema = run_script(topology, "relay.py", "schema", "--dialect", "postgresql")
    assert "CREATE TABLE IF NOT EXISTS amqp_lab_outbox" in schema.stdout
    bad = run_script(topology, "relay.py", "status", "--outbox-url", "mysql://x/y")
    assert bad.returncode == 1 and bad.stderr.startswith("error: unsupported dedup store")
    down = run_script(
        topology,
        "relay.py",
        "status",
        "--outbox-url",
        "postgresql://app:secret@127.0.0.1:1/nothing",
    )
    assert down.returncode == 1 and "secret" not in down.stderr, down.stderr
    assert down.stderr.startswith("error: cannot"), down.stderr
    url = str(tmp_path / "app.sqlite3")
    empty = run_script(topology, "relay.py", "--outbox-url", url, "--idle-exit", "0.5")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.strip().endswith(
        "relay stopped (idle for 0.5 s): 0 sent, 0 refused, 0 lost"
    )
    status = run_script(topology, "relay.py", "status", "--outbox-url", url)
    assert status.stdout.startswith(f"outbox {url}: pending=0 due=0"), status.stdout
    as_json = run_script(topology, "relay.py", "status", "--outbox-url", url, "--json")
    assert json.loads(as_json.stdout)["relays"] == []


@pytest.mark.parametrize("relay_session", [False, True])
def test_a_postgresql_lease_reads_the_oldest_rows_in_order_not_the_whole_backlog(
    monkeypatch: pytest.MonkeyPatch, relay_session: bool
) -> None:
    """A backlog committed faster than autovacuum analyzes it (after an outage, a burst)
    leaves the planner thinking the table is nearly empty; it then found the due rows with
    a bitmap scan of every pending row and sorted them, so each lease read the whole backlog
    (20,000 rows: 33 ms a lease against 11; 100,000: 68 against 18). The lease's transaction
    turns bitmap and sequential scans off: the `(available_at, id)` index is read in order
    and stops at the batch - a relay's own connection for its whole session
    (``relay_session``)."""
    plans: list[str] = []
    real_execute = HandlerDb.execute

    def explaining(self: HandlerDb, sql: str, params: Any = None) -> Any:
        if sql.startswith("WITH heads AS MATERIALIZED"):
            rows = real_execute(self, "EXPLAIN " + sql, params).fetchall()
            plans.append("\n".join(str(r[0]) for r in rows))
        return real_execute(self, sql, params)

    with temp_database() as url:
        OutboxStore(url).close()
        db = psycopg.connect(url)
        with transaction(db):
            for n in range(3000):
                add(db, message_for(NAMES, {"n": n}), key=f"k-{n % 100}", notify=False)
        db.close()
        monkeypatch.setattr(HandlerDb, "execute", explaining)
        store = OutboxStore(url, relay_session=relay_session)
        try:
            lease = store.lease("relay-1", 30.0, 50, 10**6)
        finally:
            store.close()
    assert len(lease.rows) == 50
    heads = plans[0]
    assert "Index Scan using amqp_lab_outbox_pending" in heads, heads
    assert "Bitmap" not in heads and "Seq Scan" not in heads, heads


def test_a_postgresql_lease_reads_no_more_bodies_than_its_byte_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The heads' lease returns headers and body only for rows within the batch's average
    share (``batch_bytes / batch_rows``); a larger head the batch keeps is read afterwards,
    whole. Before, every head came back with its body, the byte budget applied only after:
    a backlog of 1 MiB messages moved about 500 MiB into the relay per lease to keep 16."""
    returned: list[bytes] = []
    real_execute = HandlerDb.execute

    class Seen:
        def __init__(self, cursor: Any) -> None:
            self.rows: list[Any] = cursor.fetchall()

        def fetchall(self) -> list[Any]:
            returned.extend(r[7] for r in self.rows if isinstance(r[7], bytes))
            return self.rows

    def counting(self: HandlerDb, sql: str, params: Any = None) -> Any:
        cursor = real_execute(self, sql, params)
        return (
            Seen(cursor)
            if "RETURNING" in sql or sql.startswith("SELECT id, message_id")
            else cursor
        )

    big, small = b"B" * 100_000, b"s" * 100
    with temp_database() as url:
        OutboxStore(url).close()
        db = psycopg.connect(url)
        with transaction(db):
            for n in range(20):
                body = big if n % 2 == 0 else small
                add(db, message_for(NAMES, body, message_id=f"m-{n}"), key=f"k-{n}", notify=False)
        db.close()
        monkeypatch.setattr(HandlerDb, "execute", counting)
        store = OutboxStore(url)
        try:
            lease = store.lease("relay-1", 30.0, 20, 250_000)
        finally:
            store.close()
    # oldest first within the budget: m-0 (100 kB), m-1, m-2 (100 kB), m-3; m-4 would pass it
    assert [row.message_id for row in lease.rows.values()] == ["m-0", "m-1", "m-2", "m-3"]
    assert [row.body for row in lease.rows.values()] == [big, small, big, small]
    assert sum(len(body) for body in returned) <= 2 * 250_000, [len(b) for b in returned]


@pytest.mark.parametrize("relay_session", [False, True])
def test_a_postgresql_lease_looks_past_a_key_whose_due_rows_fill_its_window(
    relay_session: bool,
) -> None:
    """A lease looks at a window of one and a half times its rows, the oldest due first. A
    key whose head was refused has its later rows due and no head among them; with more of
    them than the window holds, every other key's rows were out of sight and the outbox
    stalled behind the one key. The lease now skips such keys (and names them, for the relay
    to skip a while), and tries their heads directly: a head retried sorts after its own due
    rows (a lease of 3 rows: a window of 4)."""
    with temp_database() as url:
        OutboxStore(url).close()
        db = psycopg.connect(url)
        with transaction(db):
            add(db, message_for(NAMES, {"n": 0}, message_id="head"), key="k", notify=False)
            for n in range(12):
                add(db, message_for(NAMES, {"n": n}, message_id=f"k{n}"), key="k", notify=False)
        with transaction(db):
            for n in range(4):
                add(db, message_for(NAMES, {}, message_id=f"o{n}"), key=f"o{n}", notify=False)
        db.close()
        store = OutboxStore(url, relay_session=relay_session)
        try:
            first = store.lease("r", 30.0, 1, 10**6)
            assert [row.message_id for row in first.rows.values()] == ["head"]
            store.complete(
                "r", [RowResult(r, Verdict.REFUSED, "refused", PARKED) for r in first.rows], False
            )
            others = store.lease("r", 30.0, 3, 10**6)
            named = [[others.rows[r].message_id for r in chain] for chain in others.chains]
            assert named == [["o0"], ["o1"], ["o2"]] and others.blocked == ["k"]
            store.complete("r", [RowResult(r, Verdict.SENT) for r in others.rows], False)
            assert store.retry("head") == 1  # due now: after its own later rows
            again = store.lease("r", 30.0, 3, 10**6)
            named = [[again.rows[r].message_id for r in chain] for chain in again.chains]
            assert named == [["o3"], ["head", "k0"]] and again.blocked == []
        finally:
            store.close()


@pytest.mark.parametrize("relay_session", [False, True])
def test_a_postgresql_lease_with_a_reach_reads_no_further_than_it(relay_session: bool) -> None:
    """A lease taken ahead (``reach``) looks for heads among that many of the oldest due rows
    only, skipped ones counted: with every key held, an unbounded one read the whole backlog
    to find nothing (75-85 ms with 99,000 rows pending). What lies beyond the reach is left
    for the next lease, which reads as far as it needs."""
    with temp_database() as url:
        OutboxStore(url).close()
        db = psycopg.connect(url)
        with transaction(db):
            for n in range(6):
                add(db, message_for(NAMES, {"n": n}, message_id=f"k{n}"), key="k", notify=False)
            add(db, message_for(NAMES, {}, message_id="j0"), key="j", notify=False)
            for n in range(2):
                add(db, message_for(NAMES, {}, message_id=f"u{n}"), key=None, notify=False)
        db.close()
        store = OutboxStore(url, relay_session=relay_session)
        try:
            head = store.lease("r", 30.0, 1, 10**6)
            assert [row.message_id for row in head.rows.values()] == ["k0"]
            held = tuple(head.rows)
            # k0 in flight, k held: 3 rows read (k0, k1, k2), none a head to take
            ahead = store.lease("r", 30.0, 1, 10**6, held, ("k",), reach=3)
            assert ahead.rows == {} and (ahead.blocked, ahead.more_behind) == ([], False)
            # a reach of 7 gets to j0, the 7th due row
            ahead = store.lease("r", 30.0, 1, 10**6, held, ("k",), reach=7)
            assert [row.message_id for row in ahead.rows.values()] == ["j0"]
            held += tuple(ahead.rows)
            # without a reach, past every row of k and j
            rest = store.lease("r", 30.0, 5, 10**6, held, ("j", "k"))
            assert sorted(row.message_id for row in rest.rows.values()) == ["u0", "u1"]
            assert store.status().pending == 9  # leased, none lost or sent
        finally:
            store.close()
