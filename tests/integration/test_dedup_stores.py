"""The dedup stores, SQLite and PostgreSQL, through one interface: the same tests run on both.

Claim + handler writes in one transaction, rollback, concurrent claims of one message_id from
several connections, retention purge, the purge command, the worker's retention check and
periodic purge, and several worker processes sharing the PostgreSQL store.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, suppress
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from amqp_lab.dedup import ManagedDedupStore, open_store
from amqp_lab.dedup.arrays import array_literal
from amqp_lab.errors import DedupStoreError, TransientError
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message
from tests.pgsupport import ADMIN_URL, postgres_answers, temp_database
from tests.support import (
    ROOT,
    consumer_count,
    parse_lines,
    ready_count,
    run_script,
    script_env,
    wait_for,
)

pytestmark = pytest.mark.integration

DAY = 86400.0
NOTES = "CREATE TABLE IF NOT EXISTS notes (message_id TEXT NOT NULL, text TEXT NOT NULL)"


class HandlerFailed(Exception):
    pass


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store location: a SQLite file, or a PostgreSQL database of its own."""
    if request.param == "sqlite":
        yield str(tmp_path / "dedup.sqlite3")
    else:
        with temp_database() as url:
            yield url


@pytest.fixture
def opened(store_url: str) -> Iterator[Callable[..., ManagedDedupStore]]:
    """``opened(clock=...)`` opens another connection to the store; all closed at the end."""
    stores: list[ManagedDedupStore] = []

    def open_one(clock: Callable[[], float] = time.time) -> ManagedDedupStore:
        store = open_store(store_url, clock)
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        store.close()


@pytest.fixture
def store(opened: Callable[..., ManagedDedupStore]) -> ManagedDedupStore:
    store = opened()
    store.run_in_transaction(lambda db: db.execute(NOTES))
    return store


def note(message_id: str, text: str = "done") -> Callable[[Any], None]:
    """A handler effect: one row in ``notes`` through the store's connection."""

    def write(db: Any) -> None:
        db.execute("INSERT INTO notes VALUES (?, ?)", (message_id, text))

    return write


def notes(store: ManagedDedupStore) -> list[tuple[str, str]]:
    rows = store.run_in_transaction(
        lambda db: db.execute("SELECT message_id, text FROM notes ORDER BY message_id").fetchall()
    )
    return [(str(m), str(t)) for m, t in rows]


# --- claim + handler writes -------------------------------------------------------------------
def test_first_claim_runs_the_work_and_commits(
    store: ManagedDedupStore, opened: Callable[..., ManagedDedupStore]
) -> None:
    assert store.process_once("m-1", note("m-1")) is True
    other = opened()  # another connection sees the committed effect and claim
    assert notes(other) == [("m-1", "done")]
    assert other.is_processed("m-1") is True


def test_a_duplicate_skips_the_work(store: ManagedDedupStore) -> None:
    results = [store.process_once("m-1", note("m-1", f"try {i}")) for i in range(3)]
    assert results == [True, False, False]
    assert notes(store) == [("m-1", "try 0")]


def test_failed_work_rolls_back_the_claim_and_its_writes(store: ManagedDedupStore) -> None:
    def fail(db: Any) -> None:
        note("m-1", "half-done")(db)
        raise HandlerFailed("handler crashed")

    with pytest.raises(HandlerFailed, match=r"^handler crashed$"):
        store.process_once("m-1", fail)
    assert (store.is_processed("m-1"), notes(store)) == (False, [])
    assert store.process_once("m-1", note("m-1", "retried")) is True
    assert notes(store) == [("m-1", "retried")]


def test_work_gets_a_handler_db_of_the_store_dialect(store: ManagedDedupStore) -> None:
    seen: list[str] = []
    store.process_once("m-1", lambda db: seen.append(db.dialect))
    assert seen == [store.dialect]


def test_a_claim_survives_reopening(
    store: ManagedDedupStore, opened: Callable[..., ManagedDedupStore]
) -> None:
    store.process_once("m-1", note("m-1"))
    store.close()
    assert opened().process_once("m-1", note("m-1", "again")) is False


def test_first_seen_keeps_the_first_time(store: ManagedDedupStore) -> None:
    assert [store.first_seen("m-1", t) for t in (1000.5, 2000.0)] == [1000.5, 1000.5]
    assert store.first_seen("m-2", 3000.0) == 3000.0


# --- the same message_id at the same moment ---------------------------------------------------
def test_a_concurrent_claim_waits_for_the_first_and_skips(
    store: ManagedDedupStore, opened: Callable[..., ManagedDedupStore]
) -> None:
    second = opened()
    started, release = threading.Event(), threading.Event()
    results: dict[str, bool] = {}

    def slow(db: Any) -> None:
        note("m-1", "first")(db)
        started.set()
        assert release.wait(30)

    a = threading.Thread(target=lambda: results.update(a=store.process_once("m-1", slow)))
    a.start()
    assert started.wait(30)
    b = threading.Thread(target=lambda: results.update(b=second.process_once("m-1", note("m-1"))))
    b.start()
    b.join(0.5)
    assert b.is_alive()  # blocked on the first transaction's claim
    release.set()
    a.join(30)
    b.join(30)
    assert results == {"a": True, "b": False}
    assert notes(store) == [("m-1", "first")]


def test_a_concurrent_claim_runs_the_work_when_the_first_rolls_back(
    store: ManagedDedupStore, opened: Callable[..., ManagedDedupStore]
) -> None:
    second = opened()
    started, release = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def crash(db: Any) -> None:
        note("m-1", "first")(db)
        started.set()
        assert release.wait(30)
        raise HandlerFailed("first worker crashed")

    def first() -> None:
        try:
            store.process_once("m-1", crash)
        except HandlerFailed as e:
            results["a"] = str(e)

    a = threading.Thread(target=first)
    a.start()
    assert started.wait(30)
    b = threading.Thread(
        target=lambda: results.update(b=second.process_once("m-1", note("m-1", "second")))
    )
    b.start()
    b.join(0.5)
    assert b.is_alive()
    release.set()
    a.join(30)
    b.join(30)
    assert results == {"a": "first worker crashed", "b": True}
    assert notes(store) == [("m-1", "second")]


def test_eight_connections_claiming_one_id_at_once_apply_it_once(
    store: ManagedDedupStore, opened: Callable[..., ManagedDedupStore]
) -> None:
    stores = [opened() for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    results: list[bool] = []

    def claim(s: ManagedDedupStore, i: int) -> None:
        barrier.wait(30)
        results.append(s.process_once("m-1", note("m-1", f"worker {i}")))

    threads = [threading.Thread(target=claim, args=(s, i)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [False] * 7 + [True]
    assert len(notes(store)) == 1


# --- batches (one transaction for many deliveries) ----------------------------------------------
def failing(message_id: str) -> Callable[[Any], None]:
    def fail(db: Any) -> None:
        note(message_id, "half-done")(db)
        raise HandlerFailed(f"{message_id} failed")

    return fail


def test_a_batch_gives_each_delivery_its_own_outcome(
    store: ManagedDedupStore, opened: Callable[..., ManagedDedupStore]
) -> None:
    store.process_once("old", note("old"))
    results = store.process_batch(
        [("a", note("a")), ("old", note("old", "again")), ("b", failing("b")), ("c", note("c"))]
    )
    assert results[:2] == [True, False] and results[3] is True
    assert isinstance(results[2], HandlerFailed)
    other = opened()  # committed before process_batch returned
    assert notes(other) == [("a", "done"), ("c", "done"), ("old", "done")]
    assert [other.is_processed(m) for m in ("a", "b", "c")] == [True, False, True]


def test_a_batch_runs_a_later_copy_when_the_first_copy_failed(store: ManagedDedupStore) -> None:
    results = store.process_batch(
        [("a", failing("a")), ("a", note("a", "second")), ("a", note("a", "third"))]
    )
    assert isinstance(results[0], HandlerFailed) and results[1:] == [True, False]
    assert notes(store) == [("a", "second")]
    assert store.is_processed("a")


def test_a_batch_whose_only_copy_failed_leaves_no_claim(store: ManagedDedupStore) -> None:
    store.process_batch([("a", failing("a")), ("b", note("b"))])
    assert (store.is_processed("a"), store.is_processed("b")) == (False, True)
    assert store.process_once("a", note("a", "retried")) is True


def test_a_batch_handler_gets_a_handler_db_of_the_store_dialect(
    store: ManagedDedupStore,
) -> None:
    seen: list[str] = []
    store.process_batch([("a", lambda db: seen.append(db.dialect))])
    assert seen == [store.dialect]


def test_a_batch_waits_for_a_claim_held_by_an_open_transaction(
    store: ManagedDedupStore, opened: Callable[..., ManagedDedupStore]
) -> None:
    batcher = opened()
    started, release = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def slow(db: Any) -> None:
        note("m-1", "single")(db)
        started.set()
        assert release.wait(30)

    a = threading.Thread(target=lambda: results.update(a=store.process_once("m-1", slow)))
    a.start()
    assert started.wait(30)
    b = threading.Thread(
        target=lambda: results.update(
            b=batcher.process_batch([("m-0", note("m-0")), ("m-1", note("m-1", "batch"))])
        )
    )
    b.start()
    b.join(0.5)
    assert b.is_alive()  # the batch waits on m-1's uncommitted claim
    release.set()
    a.join(30)
    b.join(30)
    assert results == {"a": True, "b": [True, False]}
    assert notes(store) == [("m-0", "done"), ("m-1", "single")]


def test_four_connections_batching_overlapping_ids_apply_each_once(
    store: ManagedDedupStore, opened: Callable[..., ManagedDedupStore]
) -> None:
    stores = [opened() for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    applied: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    everything = [f"m-{k:02d}" for k in range(40)]

    def run(s: ManagedDedupStore, i: int) -> None:
        # overlapping batches, each in its own order (forward, backward, shuffled)
        ids = everything[i * 5 : i * 5 + 25]
        ids = ids[::-1] if i % 2 else ids
        if i == 3:
            random.Random(7).shuffle(ids)
        try:
            barrier.wait(30)
            results = s.process_batch([(m, note(m, f"worker {i}")) for m in ids])
        except BaseException as e:  # e.g. a deadlock: fail the test, not just warn
            with lock:
                errors.append(e)
            return
        with lock:
            applied.extend(m for m, ok in zip(ids, results, strict=True) if ok is True)

    threads = [threading.Thread(target=run, args=(s, i)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert sorted(applied) == everything  # each id applied exactly once, none missing
    assert sorted(m for m, _ in notes(store)) == everything


UNIQUE = "CREATE TABLE IF NOT EXISTS uniq (k INTEGER PRIMARY KEY)"


def swallow_a_failed_statement(message_id: str) -> Callable[[Any], None]:
    """A handler that writes, then catches its own failed statement and returns normally."""

    def work(db: Any) -> None:
        note(message_id, "before")(db)
        with suppress(Exception):
            db.execute("INSERT INTO uniq VALUES (1)")  # already there: unique violation

    return work


def raise_after_a_failed_statement(db: Any) -> None:
    note("bad", "before")(db)
    db.execute("INSERT INTO uniq VALUES (1)")


@pytest.fixture
def uniq_store(store: ManagedDedupStore) -> ManagedDedupStore:
    store.run_in_transaction(lambda db: db.execute(UNIQUE))
    store.run_in_transaction(lambda db: db.execute("INSERT INTO uniq VALUES (1)"))
    return store


def test_a_handler_that_swallows_a_failed_statement_is_never_acked_without_its_effect(
    uniq_store: ManagedDedupStore, store_url: str
) -> None:
    """PostgreSQL aborts the transaction on a failed statement and would turn the COMMIT into a
    silent ROLLBACK: the message would be acked with neither claim nor writes. SQLite goes on."""
    once = swallow_a_failed_statement("once")
    batch = [("a", note("a")), ("b", swallow_a_failed_statement("b")), ("c", note("c"))]
    if store_url.startswith("postgresql"):
        with pytest.raises(TransientError, match=r"returned after a failed SQL statement"):
            uniq_store.process_once("once", once)
        results = uniq_store.process_batch(batch)
        assert isinstance(results[1], TransientError) and results[::2] == [True, True]
        assert notes(uniq_store) == [("a", "done"), ("c", "done")]
        assert [uniq_store.is_processed(m) for m in ("once", "a", "b", "c")] == [
            False,
            True,
            False,
            True,
        ]
    else:
        assert uniq_store.process_once("once", once) is True
        assert uniq_store.process_batch(batch) == [True, True, True]
        assert [m for m, _ in notes(uniq_store)] == ["a", "b", "c", "once"]


def test_a_handler_raising_after_a_failed_statement_rolls_back_alone(
    uniq_store: ManagedDedupStore,
) -> None:
    results = uniq_store.process_batch(
        [("a", note("a")), ("bad", raise_after_a_failed_statement), ("c", note("c"))]
    )
    assert results[::2] == [True, True] and isinstance(results[1], Exception)
    assert notes(uniq_store) == [("a", "done"), ("c", "done")]
    assert not uniq_store.is_processed("bad")


def test_a_handler_cannot_commit_the_batch_through_the_connection(
    store: ManagedDedupStore,
) -> None:
    results = store.process_batch(
        [("a", note("a")), ("b", lambda db: db.commit()), ("c", note("c"))]
    )
    assert results[::2] == [True, True] and isinstance(results[1], TypeError)
    assert [store.is_processed(m) for m in ("a", "b", "c")] == [True, False, True]


def test_a_handler_committing_through_sql_stops_the_batch_without_losing_any(
    store: ManagedDedupStore,
) -> None:
    """COMMIT as SQL cannot be blocked. On PostgreSQL it commits every claim of the batch: the
    claims of handlers that never ran are released again, so their redeliveries run them."""
    batch = [
        ("a", note("a")),
        ("b", lambda db: db.execute("COMMIT")),
        ("c", note("c")),
    ]
    with pytest.raises(DedupStoreError, match=r"ended the batch's transaction"):
        store.process_batch(batch)
    assert not store.is_processed("c")  # never ran: redelivered, it runs
    assert store.process_batch([("c", note("c"))]) == [True]
    assert ("c", "done") in notes(store)


# --- retention ---------------------------------------------------------------------------------
def test_purge_removes_only_records_older_than_the_cutoff(
    opened: Callable[..., ManagedDedupStore],
) -> None:
    now = [1000.0]
    store = opened(lambda: now[0])
    store.process_once("old", lambda db: None)
    store.first_seen("old", 1000.0)
    now[0] = 2000.0
    store.process_once("new", lambda db: None)
    store.first_seen("new", 2000.0)
    assert store.stats().processed == 2
    assert store.stats().oldest == 1000.0
    purged = store.purge(1500.0)
    assert (purged.processed, purged.first_seen) == (1, 1)
    assert (store.is_processed("old"), store.is_processed("new")) == (False, True)
    assert store.first_seen("old", 3000.0) == 3000.0  # forgotten, so recorded anew
    assert (store.stats().processed, store.stats().oldest) == (1, 2000.0)
    assert store.purge(1500.0).processed == 0


def _old_and_new(store_url: str) -> None:
    """One claim 10 days old and one from now."""
    with closing(open_store(store_url, lambda: time.time() - 10 * DAY)) as old:
        old.process_once("old", lambda db: None)
        old.first_seen("old", time.time() - 10 * DAY)
    with closing(open_store(store_url)) as new:
        new.process_once("new", lambda db: None)


def dedup_script(settings: BrokerSettings, *args: str) -> subprocess.CompletedProcess[str]:
    return run_script(settings, "dedup.py", *args, timeout=60)


OFFLINE = BrokerSettings("amqp://guest:guest@127.0.0.1:1/unused")  # never contacted


def test_purge_command_deletes_expired_records(store_url: str) -> None:
    _old_and_new(store_url)
    result = dedup_script(OFFLINE, "purge", "--older-than-days", "7", "--dedup-url", store_url)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("purged processed=1 first_seen=1 older_than=")
    stats = dedup_script(OFFLINE, "stats", "--dedup-url", store_url)
    assert stats.stdout.startswith("processed=1 oldest=")
    with closing(open_store(store_url)) as store:
        assert (store.is_processed("old"), store.is_processed("new")) == (False, True)


def test_purge_command_refuses_an_age_within_horizon_plus_replay_window(store_url: str) -> None:
    _old_and_new(store_url)
    result = dedup_script(OFFLINE, "purge", "--older-than-days", "3", "--dedup-url", store_url)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: dedup retention of 259200 s (3 days) is not longer than the retry horizon "
        "2700 s (0.03125 days) plus the replay window 259200 s (3 days): a copy arriving later "
        "would be applied twice; keep records longer than 261900 s (3.031 days)"
    )
    with closing(open_store(store_url)) as store:
        assert store.stats().processed == 2


def test_worker_refuses_a_retention_shorter_than_horizon_plus_replay(tmp_path: Path) -> None:
    result = run_script(
        OFFLINE,
        "worker.py",
        *("--retry", "backoff", "--max-attempts", "5", "--base", "1", "--cap", "30"),
        *("--retention-days", "1", "--replay-window-days", "1"),
        *("--dedup-path", str(tmp_path / "d.sqlite3")),
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "error: dedup retention of 86400 s (1 days) is not longer than the retry horizon "
        "15 s (0.0001736 days) plus the replay window 86400 s (1 days): a copy arriving later "
        "would be applied twice; keep records longer than 86415 s (1 days)"
    )
    assert not (tmp_path / "d.sqlite3").exists()  # refused before opening anything


def test_worker_purges_expired_records_at_start(topology: BrokerSettings, store_url: str) -> None:
    _old_and_new(store_url)
    result = run_script(topology, "worker.py", "--idle-exit", "0.5", "--dedup-url", store_url)
    assert result.returncode == 0, result.stderr
    with closing(open_store(store_url)) as store:
        assert (store.is_processed("old"), store.is_processed("new")) == (False, True)


# --- several worker processes on one queue -------------------------------------------------------
def test_two_worker_processes_share_the_store(topology: BrokerSettings, store_url: str) -> None:
    """20 message_ids, each published twice back to back once both workers are subscribed: the
    broker hands the two copies to the two workers in turn, at about the same moment. Each id
    is applied exactly once."""
    workers = [
        subprocess.Popen(
            [
                *(sys.executable, str(ROOT / "scripts" / "worker.py"), "--prefetch", "1"),
                *("--idle-exit", "4", "--dedup-url", store_url),
            ],
            env=script_env(topology),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    # publishing before the second worker subscribes let the first take every message
    wait_for(lambda: consumer_count(topology, "q:tasks") == 2, what="both workers subscribed")
    with Publisher(topology) as publisher:
        for seq in range(20):
            message = task_message("ok", seq, f"m-{seq:02d}")
            publisher.publish(message)
            publisher.publish(message)
    outputs = [w.communicate(timeout=90) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    rows = [row for out, _ in outputs for row in parse_lines(out)]
    assert sorted(r["outcome"] for r in rows) == ["duplicate"] * 20 + ["processed"] * 20
    assert all(parse_lines(out) for out, _ in outputs)  # both workers took part
    with closing(open_store(store_url)) as store:
        effects = store.run_in_transaction(
            lambda db: db.execute("SELECT message_id FROM effects").fetchall()
        )
    assert sorted(m for (m,) in effects) == [f"m-{seq:02d}" for seq in range(20)]
    assert ready_count(topology, "q:tasks") == 0


def test_a_message_id_holding_a_nul_is_dead_lettered_and_the_worker_goes_on(
    topology: BrokerSettings, store_url: str
) -> None:
    """AMQP lets a message_id hold U+0000, PostgreSQL text cannot: its claim failed the whole
    batch's transaction, the worker stopped on the store error, and the redelivery did the same
    to every worker after it. Now the delivery is invalid (a business error: to the DLQ, with
    its reason) before any claim, on either store, and its neighbours are processed."""
    with Publisher(topology) as publisher:
        for message_id in ("m-1", "m-\x00-2", "m-3"):
            publisher.publish(task_message("ok", 1, message_id))
    result = run_script(topology, "worker.py", "--idle-exit", "0.5", "--dedup-url", store_url)
    assert result.returncode == 0, result.stderr
    outcomes = {r["message_id"]: r["outcome"] for r in parse_lines(result.stdout)}
    assert outcomes == {"m-1": "processed", "m-\\x00-2": "dead-lettered", "m-3": "processed"}
    assert "message_id contains a NUL character" in result.stdout
    assert (ready_count(topology, "q:tasks"), ready_count(topology, "q:tasks:dlq")) == (0, 1)
    with closing(open_store(store_url)) as store:
        assert (store.is_processed("m-1"), store.is_processed("m-3")) == (True, True)


# --- errors --------------------------------------------------------------------------------------
def test_an_unreachable_postgres_is_a_dedup_store_error_without_the_password() -> None:
    with pytest.raises(DedupStoreError) as caught:
        open_store("postgresql://postgres:s3cret-pw@127.0.0.1:1/nowhere")
    assert str(caught.value).startswith(
        "cannot open dedup store postgresql://postgres:***@127.0.0.1:1/nowhere: "
    )
    assert "s3cret-pw" not in str(caught.value)


def test_the_stats_command_masks_the_password() -> None:
    result = dedup_script(OFFLINE, "stats", "--dedup-url", "postgresql://u:s3cret-pw@127.0.0.1:1/x")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "error: cannot open dedup store postgresql://u:***@127.0.0.1:1/x"
    )
    assert "s3cret-pw" not in result.stdout + result.stderr


# any text but NUL and lone surrogates, which no message_id or key that reaches a store can
# hold (amqp_lab.message refuses them as not Unicode text; PostgreSQL cannot store them)
POSTGRES_TEXT = st.characters(codec="utf-8", exclude_characters="\x00")


@examples(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(POSTGRES_TEXT), max_size=8))
def test_any_text_list_reaches_postgresql_as_itself(texts: list[str]) -> None:
    """The dedup store's claim and the outbox relay send id and key lists as one text
    parameter (amqp_lab.dedup.arrays.array_literal): every text comes back as itself -
    quotes, backslashes, braces, commas, "NULL", the empty text - in order."""
    if not postgres_answers(ADMIN_URL):
        pytest.skip(f"no PostgreSQL answers at {ADMIN_URL}")
    with closing(psycopg.connect(ADMIN_URL)) as db:
        row = db.execute("SELECT %s::text[]", (array_literal(texts),)).fetchone()
    assert row is not None and row[0] == texts
