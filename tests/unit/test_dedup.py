"""SqliteDedupStore: claim + handler writes in one transaction, first_seen, is_processed."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.dedup import HandlerDb, SqliteDedupStore, run_in_savepoint
from amqp_lab.errors import DedupStoreError

pytestmark = pytest.mark.unit


class HandlerFailed(Exception):
    pass


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "dedup.sqlite3"


@pytest.fixture
def store(db_path: Path) -> Iterator[SqliteDedupStore]:
    store = SqliteDedupStore(db_path)
    yield store
    store.close()


@pytest.fixture
def notes_store(store: SqliteDedupStore) -> SqliteDedupStore:
    """The store with a ``notes`` table for the handler's own writes."""
    store.process_once("setup", lambda db: db.execute("CREATE TABLE notes (text TEXT)"))
    return store


def _notes(path: Path) -> list[str]:
    """The committed notes, read through a separate connection."""
    with closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute("SELECT text FROM notes ORDER BY rowid")]


def _fail(db: Any) -> None:
    db.execute("INSERT INTO notes VALUES ('half-done')")
    raise HandlerFailed("handler crashed")


# --- process_once ---------------------------------------------------------------------------
def test_first_call_runs_work_and_returns_true(store: SqliteDedupStore) -> None:
    calls: list[str] = []
    assert store.process_once("m-1", lambda db: calls.append("m-1")) is True
    assert calls == ["m-1"]


def test_second_call_for_the_same_id_skips_work_and_returns_false(
    store: SqliteDedupStore,
) -> None:
    calls: list[str] = []
    store.process_once("m-1", lambda db: calls.append("first"))
    assert store.process_once("m-1", lambda db: calls.append("second")) is False
    assert calls == ["first"]


def test_different_ids_are_independent(store: SqliteDedupStore) -> None:
    assert [store.process_once(m, lambda db: None) for m in ("m-1", "m-2", "m-1")] == [
        True,
        True,
        False,
    ]


def test_work_receives_the_stores_handler_db(store: SqliteDedupStore) -> None:
    seen: list[Any] = []
    store.process_once("m-1", seen.append)
    assert [(type(db), db.dialect) for db in seen] == [(HandlerDb, "sqlite")]


def test_failed_work_re_raises(store: SqliteDedupStore) -> None:
    def boom(db: Any) -> None:
        raise HandlerFailed("handler crashed")

    with pytest.raises(HandlerFailed, match=r"^handler crashed$"):
        store.process_once("m-1", boom)


def test_failed_work_rolls_back_the_claim(store: SqliteDedupStore) -> None:
    def boom(db: Any) -> None:
        raise HandlerFailed("handler crashed")

    with pytest.raises(HandlerFailed):
        store.process_once("m-1", boom)
    calls: list[str] = []
    assert store.process_once("m-1", lambda db: calls.append("retry")) is True
    assert calls == ["retry"]


def test_failed_work_rolls_back_its_own_writes(
    notes_store: SqliteDedupStore, db_path: Path
) -> None:
    with pytest.raises(HandlerFailed):
        notes_store.process_once("m-1", _fail)
    assert _notes(db_path) == []


def test_successful_work_writes_are_committed(notes_store: SqliteDedupStore, db_path: Path) -> None:
    notes_store.process_once("m-1", lambda db: db.execute("INSERT INTO notes VALUES ('done')"))
    assert _notes(db_path) == ["done"]


def test_duplicate_does_not_repeat_the_writes(notes_store: SqliteDedupStore, db_path: Path) -> None:
    for _ in range(3):
        notes_store.process_once("m-1", lambda db: db.execute("INSERT INTO notes VALUES ('x')"))
    assert _notes(db_path) == ["x"]


def test_claim_survives_reopening_the_store(db_path: Path) -> None:
    with closing(SqliteDedupStore(db_path)) as first:
        first.process_once("m-1", lambda db: None)
    with closing(SqliteDedupStore(db_path)) as second:
        assert second.process_once("m-1", lambda db: None) is False


# --- is_processed ---------------------------------------------------------------------------
def test_is_processed_is_false_for_an_unknown_id(store: SqliteDedupStore) -> None:
    assert store.is_processed("m-1") is False


def test_is_processed_after_success(store: SqliteDedupStore) -> None:
    store.process_once("m-1", lambda db: None)
    assert (store.is_processed("m-1"), store.is_processed("m-2")) == (True, False)


def test_is_not_processed_after_failed_work(store: SqliteDedupStore) -> None:
    def boom(db: Any) -> None:
        raise HandlerFailed("handler crashed")

    with pytest.raises(HandlerFailed):
        store.process_once("m-1", boom)
    assert store.is_processed("m-1") is False


# --- first_seen --------------------------------------------------------------------------------
def test_first_seen_records_now_the_first_time(store: SqliteDedupStore) -> None:
    assert store.first_seen("m-1", 1000.5) == 1000.5


def test_first_seen_returns_the_first_time_on_later_calls(store: SqliteDedupStore) -> None:
    store.first_seen("m-1", 1000.5)
    assert [store.first_seen("m-1", now) for now in (2000.0, 500.0)] == [1000.5, 1000.5]


def test_first_seen_is_per_message_id(store: SqliteDedupStore) -> None:
    store.first_seen("m-1", 1000.0)
    assert store.first_seen("m-2", 2000.0) == 2000.0


def test_first_seen_is_independent_of_processing(store: SqliteDedupStore) -> None:
    store.first_seen("m-1", 1000.0)
    assert store.is_processed("m-1") is False


# --- opening -----------------------------------------------------------------------------------
def test_store_creates_missing_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "dedup.sqlite3"
    with closing(SqliteDedupStore(path)):
        pass
    assert path.is_file()


def test_store_uses_wal_mode(store: SqliteDedupStore, db_path: Path) -> None:
    with closing(sqlite3.connect(db_path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_unopenable_path_raises_dedup_store_error(tmp_path: Path) -> None:
    with pytest.raises(DedupStoreError, match=rf"^cannot open dedup store {tmp_path}: "):
        SqliteDedupStore(tmp_path)


# --- process_batch ---------------------------------------------------------------------------


def _note(text: str) -> Any:
    return lambda db: db.execute("INSERT INTO notes VALUES (?)", (text,))


def _statements(store: SqliteDedupStore) -> list[str]:
    """Record every SQL statement the store's connection runs from now on."""
    seen: list[str] = []
    store._connection().set_trace_callback(seen.append)  # this thread's connection
    return seen


def test_batch_results_are_per_delivery_in_order(
    notes_store: SqliteDedupStore, db_path: Path
) -> None:
    notes_store.process_once("old", _note("old"))
    results = notes_store.process_batch(
        [("a", _note("a")), ("old", _note("old again")), ("b", _fail), ("c", _note("c"))]
    )
    assert results[:2] == [True, False]
    assert isinstance(results[2], HandlerFailed)
    assert results[3] is True
    assert _notes(db_path) == ["old", "a", "c"]  # b's half-done write rolled back alone


def test_batch_claims_only_the_successes(notes_store: SqliteDedupStore) -> None:
    notes_store.process_batch([("a", _note("a")), ("b", _fail)])
    assert notes_store.is_processed("a")
    assert not notes_store.is_processed("b")


def test_batch_duplicate_within_the_batch_runs_once(
    notes_store: SqliteDedupStore, db_path: Path
) -> None:
    assert notes_store.process_batch([("a", _note("1")), ("a", _note("2"))]) == [True, False]
    assert _notes(db_path) == ["1"]


def test_batch_retries_an_id_whose_first_copy_failed(
    notes_store: SqliteDedupStore, db_path: Path
) -> None:
    results = notes_store.process_batch([("a", _fail), ("a", _note("second"))])
    assert isinstance(results[0], HandlerFailed) and results[1] is True
    assert _notes(db_path) == ["second"]


def test_batch_of_handlers_without_writes_runs_no_savepoint(store: SqliteDedupStore) -> None:
    seen = _statements(store)
    store.process_batch([(f"m-{i}", lambda db: None) for i in range(500)])
    assert not [s for s in seen if "SAVEPOINT" in s or "RELEASE" in s]
    # BEGIN, one SELECT of held claims, one INSERT of 500 rows, COMMIT
    assert [s.split()[0] for s in seen] == ["BEGIN", "SELECT", "INSERT", "COMMIT"]
    assert all(store.is_processed(f"m-{i}") for i in range(500))


def test_batch_savepoint_opens_on_first_use_of_the_connection(
    notes_store: SqliteDedupStore,
) -> None:
    seen = _statements(notes_store)
    notes_store.process_batch([("a", _note("a")), ("b", lambda db: None)])
    assert [s for s in seen if "SAVEPOINT" in s or "RELEASE" in s] == [
        "SAVEPOINT delivery",
        "RELEASE delivery",
    ]


def test_batch_handler_sees_the_sqlite_dialect(store: SqliteDedupStore) -> None:
    seen: list[str] = []
    store.process_batch([("a", lambda db: seen.append(db.dialect))])
    assert seen == ["sqlite"]


def _with_block(db: Any) -> None:
    with db:
        db.execute("INSERT INTO notes VALUES ('early')")


@pytest.mark.parametrize(
    "end_early",
    [
        _with_block,
        lambda db: db.commit(),
        lambda db: db.rollback(),
        lambda db: db.close(),
        lambda db: db.executescript("INSERT INTO notes VALUES ('early')"),
        lambda db: setattr(db, "autocommit", True),
    ],
    ids=["with", "commit", "rollback", "close", "executescript", "autocommit"],
)
def test_batch_handler_cannot_end_the_batch_transaction(
    notes_store: SqliteDedupStore, db_path: Path, end_early: Any
) -> None:
    results = notes_store.process_batch([("a", _note("a")), ("b", end_early), ("c", _note("c"))])
    assert results[0] is True and results[2] is True
    assert isinstance(results[1], TypeError | AttributeError)
    assert _notes(db_path) == ["a", "c"]
    assert not notes_store.is_processed("b")


def test_batch_handler_committing_through_sql_stops_the_batch(
    notes_store: SqliteDedupStore, db_path: Path
) -> None:
    # the error names the delivery whose handler ended it (one check serves the whole batch)
    with pytest.raises(DedupStoreError, match=r"message_id='b' ended the batch's transaction"):
        notes_store.process_batch(
            [("a", _note("a")), ("b", lambda db: db.execute("COMMIT")), ("c", _note("c"))]
        )
    assert not notes_store.is_processed("a")  # no claim was committed
    assert notes_store.process_batch([("x", _note("x"))]) == [True]  # the store still works


def test_batch_handles_a_message_id_with_nul(store: SqliteDedupStore) -> None:
    assert store.process_once("a\x00x", lambda db: None) is True
    assert store.process_batch([("a\x00x", lambda db: None), ("a", lambda db: None)]) == [
        False,
        True,
    ]
    assert store.process_batch([("a\x00y", lambda db: None)] * 2) == [True, False]


def test_empty_batch(store: SqliteDedupStore) -> None:
    assert store.process_batch([]) == []


def test_batch_claims_are_committed_before_it_returns(
    store: SqliteDedupStore, db_path: Path
) -> None:
    store.process_batch([("a", lambda db: None), ("b", lambda db: None)])
    with closing(sqlite3.connect(db_path)) as other:
        ids = [row[0] for row in other.execute("SELECT message_id FROM processed ORDER BY 1")]
    assert ids == ["a", "b"]


def test_batch_claims_beyond_500_take_one_insert_per_500(store: SqliteDedupStore) -> None:
    seen = _statements(store)
    assert store.process_batch([(f"m-{i}", lambda db: None) for i in range(1201)]) == [True] * 1201
    assert [s.split()[0] for s in seen].count("INSERT") == 3
    assert store.stats().processed == 1201


# --- a transaction that could not begin, or ended under the handler -------------------------
def test_a_handler_retrying_a_refused_begin_writes_inside_the_claim(db_path: Path) -> None:
    """Another writer holds the lock past the busy timeout: the handler's first statement fails
    to BEGIN; when the handler catches that and tries again, it begins again - its write never
    commits on its own, without the claim (the redelivery would apply it twice)."""
    store = SqliteDedupStore(db_path, busy_timeout=0.1)
    store.run_in_transaction(lambda db: db.execute("CREATE TABLE notes (text TEXT)"))
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    errors: list[str] = []

    def stubborn(db: Any) -> None:
        for _ in range(5):
            try:
                db.execute("INSERT INTO notes VALUES ('once')")
                return
            except DedupStoreError as e:
                errors.append(type(e).__name__)
                if other.in_transaction:
                    other.execute("COMMIT")  # the other writer is done: the retry can begin

    assert store.process_once("m-1", stubborn) is True
    assert errors == ["StoreUnavailable"]
    assert store.process_once("m-1", stubborn) is False  # the redelivery
    assert _notes(db_path) == ["once"]
    other.close()
    store.close()


def test_a_statement_after_the_transaction_ended_is_refused_not_autocommitted(
    notes_store: SqliteDedupStore, db_path: Path
) -> None:
    def ends_it(db: Any) -> None:
        db.execute("INSERT INTO notes VALUES ('rolled back')")
        db.execute("ROLLBACK")  # as SQLite does by itself on a full disk or an I/O error
        db.execute("INSERT INTO notes VALUES ('would autocommit')")

    with pytest.raises(DedupStoreError, match="transaction ended under the handler"):
        notes_store.process_once("m-1", ends_it)
    assert (_notes(db_path), notes_store.is_processed("m-1")) == ([], False)


class _SavepointRefused:
    """A connection whose every statement fails, as a database that lost its disk does."""

    in_transaction = True

    def execute(self, sql: str, *params: Any) -> None:
        raise sqlite3.OperationalError(f"disk I/O error ({sql})")


def test_a_savepoint_the_database_refuses_is_a_store_error_not_the_handlers() -> None:
    """The handler's first statement opens the savepoint; when the database refuses it, that
    is the store failing (raised: nothing of the batch commits, nothing is acked), never
    returned as the handler's own failure (which would dead-letter a healthy message)."""
    with pytest.raises(DedupStoreError, match="SAVEPOINT delivery failed: disk I/O error"):
        run_in_savepoint(
            _SavepointRefused(), "sqlite", lambda db: db.execute("SELECT 1"), lambda: None
        )


def test_a_handler_that_never_touches_db_needs_no_working_database() -> None:
    assert run_in_savepoint(_SavepointRefused(), "sqlite", lambda db: None, lambda: None) is None
