"""The outbox on a real SQLite file, without a broker: what add and cancel write in the
caller's transaction (and in a handler's, with its claim), and how the relay's store leases,
records outcomes, holds a key behind a refused or scheduled row, and lives with a clock that
jumps (SQLite's clock is the host's: injected here)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.errors import OutboxError, OutboxUnavailable, UnencodableMessage
from amqp_lab.message import OutgoingMessage
from amqp_lab.outbox import CancelResult, add, cancel, create_schema
from amqp_lab.outbox.outcomes import LOST_DELAY, PARKED, RowResult, Verdict
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.outbox.wake import RelayLock

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def msg(message_id: str, **fields: Any) -> OutgoingMessage:
    return OutgoingMessage(
        body=b"{}", message_id=message_id, exchange="x", routing_key="r", **fields
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "app.sqlite3"


@pytest.fixture
def store(path: Path, clock: Clock) -> OutboxStore:
    return OutboxStore(path, clock=clock)


def write(path: Path, clock: Clock, *rows: tuple[str, str | None, float | None]) -> None:
    """Commit one transaction adding (message_id, key, due_at) rows."""
    db = sqlite3.connect(path)
    with db:
        for message_id, key, due in rows:
            add(db, msg(message_id), key=key, due_at=due, clock=clock)
    db.close()


def ids(store: OutboxStore, lease: Any) -> list[list[str]]:
    return [[lease.rows[r].message_id for r in chain] for chain in lease.chains]


def test_a_row_commits_or_rolls_back_with_the_callers_transaction(path: Path, clock: Clock) -> None:
    db = sqlite3.connect(path)
    create_schema(db)
    with pytest.raises(RuntimeError), db:
        db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER)")
        assert add(db, msg("rolled-back"), clock=clock) is True
        raise RuntimeError
    with db:
        assert add(db, msg("kept"), clock=clock) is True
        assert add(db, msg("kept", priority=9), clock=clock) is False  # the first one stays
    rows = db.execute("SELECT message_id, properties FROM amqp_lab_outbox").fetchall()
    assert rows == [("kept", '{"content_type":"application/json","persistent":true}')]
    with pytest.raises(UnencodableMessage), db:
        add(db, msg("bad", priority=256), clock=clock)
    assert db.execute("SELECT count(*) FROM amqp_lab_outbox").fetchone() == (1,)


def test_without_the_table_add_says_how_to_make_it(path: Path) -> None:
    with pytest.raises(OutboxError, match="create_schema"):
        add(sqlite3.connect(path), msg("m"))
    with pytest.raises(TypeError):
        add(object(), msg("m"))


def test_a_handlers_follow_ups_commit_with_its_claim_or_not_at_all(
    path: Path, store: OutboxStore
) -> None:
    dedup = SqliteDedupStore(path)

    def emits(message_id: str, fail: bool = False) -> Any:
        def work(db: Any) -> None:
            add(db, msg(f"follow-{message_id}"))
            if fail:
                raise RuntimeError("the handler failed")

        return work

    assert dedup.process_once("a", emits("a")) is True
    with pytest.raises(RuntimeError):
        dedup.process_once("b", emits("b", fail=True))
    assert dedup.process_once("a", emits("a")) is False  # a duplicate adds nothing
    results = dedup.process_batch([("c", emits("c")), ("d", emits("d", fail=True))])
    assert results[0] is True and isinstance(results[1], RuntimeError)
    db = sqlite3.connect(path)
    assert [r[0] for r in db.execute("SELECT message_id FROM amqp_lab_outbox ORDER BY id")] == [
        "follow-a",
        "follow-c",
    ]
    dedup.close()


def test_only_a_keys_head_starts_a_chain_and_a_second_relay_finds_nothing(
    path: Path, store: OutboxStore, clock: Clock
) -> None:
    write(path, clock, ("a1", "a", None), ("b1", "b", None), ("a2", "a", None), ("n1", None, None))
    write(path, clock, ("a3", "a", None))
    first = store.lease("r1", 30, 100, 10**6)
    assert ids(store, first) == [["a1", "a2", "a3"], ["b1"], ["n1"]]
    assert store.lease("r2", 30, 100, 10**6).rows == {}
    write(path, clock, ("a4", "a", None), ("b2", "b", None))
    assert store.lease("r2", 30, 100, 10**6).rows == {}  # a and b are held by r1's heads
    sent = [RowResult(r, Verdict.SENT) for r in first.rows]
    store.complete("r2", sent, keep_sent=False)  # not r2's: nothing changes
    assert store.status().pending == 7
    store.complete("r1", sent, keep_sent=False)
    assert ids(store, store.lease("r2", 30, 100, 10**6)) == [["a4"], ["b2"]]


def test_a_row_not_yet_due_holds_its_keys_later_rows(
    path: Path, store: OutboxStore, clock: Clock
) -> None:
    write(path, clock, ("later", "k", clock.now + 60), ("after", "k", None), ("free", "j", None))
    lease = store.lease("r", 30, 100, 10**6)
    assert ids(store, lease) == [["free"]]
    store.complete("r", [RowResult(r, Verdict.SENT) for r in lease.rows], keep_sent=False)
    status = store.status()
    assert (status.pending, status.due, status.scheduled) == (2, 1, 1)
    clock.now += 61
    lease = store.lease("r", 30, 100, 10**6)
    assert ids(store, lease) == [["later", "after"]]


def test_a_refused_row_holds_only_its_key_until_its_retry_or_an_operator(
    path: Path, store: OutboxStore, clock: Clock
) -> None:
    write(path, clock, ("bad", "k", None), ("next", "k", None), ("other", "j", None))
    lease = store.lease("r", 30, 1, 10**6)  # one row: bad
    (bad_id,) = lease.rows
    store.complete(
        "r", [RowResult(bad_id, Verdict.REFUSED, "MessageUnroutable: no queue", 5)], False
    )
    other = store.lease("r", 30, 100, 10**6)
    assert ids(store, other) == [["other"]]
    store.complete("r", [RowResult(r, Verdict.SENT) for r in other.rows], keep_sent=False)
    status = store.status()
    assert (status.failed, status.parked) == (1, 0)
    (failed,) = store.failed()
    assert (failed.message_id, failed.retry_at, failed.tries) == ("bad", clock.now + 5, 1)
    clock.now += 6
    again = store.lease("r", 30, 100, 10**6)
    assert ids(store, again) == [["bad", "next"]]
    store.complete(
        "r",
        [RowResult(bad_id, Verdict.REFUSED, "UnencodableMessage", PARKED)]
        + [RowResult(r, Verdict.UNATTEMPTED) for r in again.rows if r != bad_id],
        False,
    )
    clock.now += 10**6
    assert store.lease("r", 30, 100, 10**6).rows == {}  # parked: never by itself
    assert store.failed()[0].as_dict()["parked"] is True and store.status().parked == 1
    assert store.retry("bad") == 1
    assert ids(store, store.lease("r", 30, 100, 10**6)) == [["bad", "next"]]


@pytest.mark.parametrize("hold", ["parked", "waiting", "scheduled"])
def test_more_due_rows_behind_a_held_back_head_than_a_window_holds_stall_only_their_key(
    path: Path, store: OutboxStore, clock: Clock, hold: str
) -> None:
    """A lease looks at a window of twice its rows (the oldest due ones). Rows of key k behind
    a head that cannot go - refused and parked, refused and waiting, or not yet due - are due
    but no heads; with more of them than the window holds, every later key's rows were out of
    sight and the whole outbox stalled behind k (a lease of 3 rows: a window of 6)."""
    due = clock.now + 60 if hold == "scheduled" else None
    write(path, clock, ("head", "k", due), *((f"k{i}", "k", None) for i in range(20)))
    write(path, clock, *((f"other{i}", f"o{i}", None) for i in range(4)))
    if hold != "scheduled":
        lease = store.lease("r", 30, 1, 10**6)
        (head_id,) = lease.rows
        wait = PARKED if hold == "parked" else 30.0
        store.complete("r", [RowResult(head_id, Verdict.REFUSED, "refused", wait)], False)
    lease = store.lease("r", 30, 3, 10**6)
    assert ids(store, lease) == [["other0"], ["other1"], ["other2"]]
    assert lease.blocked == ["k"]  # for the relay to skip a while
    again = store.lease("r", 30, 3, 10**6, exclude=list(lease.rows), held=["o0", "o1", "o2"])
    assert ids(store, again) == [["other3"]]
    clock.now += 61  # the wait and the due time are over: k goes again, from its head
    if hold == "parked":
        assert store.retry("head") == 1
    store.complete("r", [RowResult(r, Verdict.SENT) for r in [*lease.rows, *again.rows]], False)
    assert ids(store, store.lease("r", 30, 3, 10**6)) == [["head", "k0", "k1"]]


def test_discarding_a_refused_row_lets_its_key_go_on(
    path: Path, store: OutboxStore, clock: Clock
) -> None:
    write(path, clock, ("bad", "k", None), ("next", "k", None))
    lease = store.lease("r", 30, 1, 10**6)
    store.complete("r", [RowResult(r, Verdict.REFUSED, "x", PARKED) for r in lease.rows], False)
    assert store.discard("next") is None  # not refused: cancel() is for that
    discarded = store.discard("bad")
    assert discarded is not None and discarded.message_id == "bad"
    assert ids(store, store.lease("r", 30, 100, 10**6)) == [["next"]]


def test_lost_and_untried_rows_come_back_and_only_tried_ones_count(
    path: Path, store: OutboxStore, clock: Clock
) -> None:
    write(path, clock, ("a", "k", None), ("b", "k", None))
    lease = store.lease("r", 30, 100, 10**6)
    a, b = sorted(lease.rows)
    store.complete(
        "r",
        [
            RowResult(a, Verdict.LOST, "PublishFailed", LOST_DELAY),
            RowResult(b, Verdict.UNATTEMPTED),
        ],
        False,
    )
    db = sqlite3.connect(store.target)
    assert db.execute("SELECT message_id, tries FROM amqp_lab_outbox ORDER BY id").fetchall() == [
        ("a", 1),
        ("b", 0),
    ]
    assert store.lease("r", 30, 100, 10**6).rows == {}
    clock.now += LOST_DELAY
    assert ids(store, store.lease("r", 30, 100, 10**6)) == [["a", "b"]]


def test_cancel_says_what_became_of_the_row(path: Path, store: OutboxStore, clock: Clock) -> None:
    write(path, clock, *((name, None, clock.now + 60) for name in ("s1", "s2", "s3", "s4")))
    db = sqlite3.connect(path)
    with db:
        assert cancel(db, "s1", clock=clock) is CancelResult.CANCELLED
        assert cancel(db, "nope", clock=clock) is CancelResult.NOT_FOUND
    clock.now += 61
    lease = store.lease("r", 30, 100, 10**6)
    by_id = {row.message_id: row_id for row_id, row in lease.rows.items()}
    with db:
        assert cancel(db, "s2", clock=clock) is CancelResult.IN_FLIGHT
    store.complete(
        "r",
        [
            RowResult(by_id["s2"], Verdict.SENT),
            RowResult(by_id["s3"], Verdict.LOST, "x", 1.0),
            RowResult(by_id["s4"], Verdict.UNATTEMPTED),
        ],
        keep_sent=True,
    )
    with db:
        assert cancel(db, "s2", clock=clock) is CancelResult.SENT
        assert cancel(db, "s3", clock=clock) is CancelResult.CANCELLED_AFTER_TRY
        assert cancel(db, "s4", clock=clock) is CancelResult.CANCELLED  # never tried
    clock.now += 100
    assert store.purge_sent(clock.now - 50) == 1
    with db:
        assert cancel(db, "s2", clock=clock) is CancelResult.NOT_FOUND


def test_a_clock_jump_past_the_lease_makes_a_duplicate_never_a_reordering(
    path: Path, store: OutboxStore, clock: Clock
) -> None:
    """SQLite's lease runs on the host's clock. Jumping forward past it lets a second lease
    take the key's head again while the first holder still works: the same rows go twice
    (their message_ids dedup them), each chain still starts at the head. The first holder's
    records are fenced off. A jump backward only makes leases last longer."""
    write(path, clock, ("a1", "k", None), ("a2", "k", None))
    first = store.lease("r1", 30, 100, 10**6)
    clock.now -= 3600
    assert store.lease("r2", 30, 100, 10**6).rows == {}
    clock.now += 3600 + 31
    second = store.lease("r2", 30, 100, 10**6)
    assert ids(store, second) == ids(store, first) == [["a1", "a2"]]
    store.complete("r1", [RowResult(r, Verdict.SENT) for r in first.rows], False)
    assert store.status().pending == 2  # r1 no longer owns them
    store.complete("r2", [RowResult(r, Verdict.SENT) for r in second.rows], False)
    assert store.status().pending == 0


def test_the_status_counts_due_scheduled_failed_and_the_oldest_age(
    path: Path, store: OutboxStore, clock: Clock
) -> None:
    write(path, clock, ("old", None, None))
    clock.now += 40
    write(path, clock, ("new", None, None), ("later", None, clock.now + 100))
    store.heartbeat("relay-1", clock.now)
    status = store.status()
    assert (status.pending, status.due, status.scheduled, status.oldest_due_age) == (3, 2, 1, 40.0)
    assert [r.relay_id for r in status.relays] == ["relay-1"]
    store.forget_relay("relay-1")
    assert store.status().relays == ()


def test_one_relay_lock_per_file_released_when_its_holder_dies(tmp_path: Path) -> None:
    lock_path = tmp_path / "app.sqlite3.relay-lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from amqp_lab.outbox.wake import "
            "RelayLock; assert RelayLock(Path(sys.argv[1])).try_acquire(); print('held', "
            "flush=True); time.sleep(60)",
            str(lock_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        mine = RelayLock(lock_path)
        assert mine.try_acquire() is False and str(holder.pid) in mine.holder()
        holder.kill()
        holder.wait(10)
        deadline = time.monotonic() + 10
        while not mine.try_acquire():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert RelayLock(lock_path).try_acquire() is False  # another handle: still exclusive
        mine.release()
        assert RelayLock(lock_path).try_acquire() is True
    finally:
        holder.kill()
        holder.wait(10)


def test_an_outbox_in_memory_is_refused() -> None:
    with pytest.raises(OutboxError, match="memory"):
        OutboxStore(":memory:")


def test_taking_the_relay_lock_resets_the_last_holders_leases_once(tmp_path: Path) -> None:
    """RelayLock.take: the first take runs ``reset`` (the last holder's leases), later ones
    hold already; a reset that fails leaves the lock free for the next try; a lock file that
    cannot be opened is an OutboxError naming it."""
    resets: list[int] = []

    def reset() -> int:
        resets.append(1)
        return 3

    lock = RelayLock(tmp_path / "outbox.relay-lock")
    assert lock.take(reset) is True and lock.take(reset) is True
    assert resets == [1]
    assert RelayLock(tmp_path / "outbox.relay-lock").take(reset) is False  # held: no reset
    assert resets == [1]
    lock.release()

    def failing() -> int:
        raise OutboxUnavailable("the database is down")

    with pytest.raises(OutboxUnavailable):
        lock.take(failing)
    other = RelayLock(tmp_path / "outbox.relay-lock")
    assert not lock.held and other.try_acquire()
    other.release()
    with pytest.raises(OutboxError, match=r"cannot open the relay lock .*missing"):
        RelayLock(tmp_path / "missing" / "lock").take(reset)


def test_a_refused_message_id_that_is_not_utf8_is_named_by_its_text_or_its_bytes(
    tmp_path: Path,
) -> None:
    """The status shows a SQLite message_id that is not UTF-8 with U+FFFD; retry and discard
    take that text, or the bytes themselves as a shell passes them on (lone surrogates);
    when a row's message_id really is that text too, the text names neither (before: the
    text matched no row, and the bytes raised UnicodeEncodeError)."""
    url = str(tmp_path / "outbox.sqlite3")
    store = OutboxStore(url)
    db = sqlite3.connect(url)
    with db:
        for message_id in ("CAST(x'78ff' AS TEXT)", "CAST(x'78fe' AS TEXT)", "'x\ufffd'"):
            db.execute(
                "INSERT INTO amqp_lab_outbox (message_id, exchange, routing_key, properties,"
                " headers, body, created_at, available_at, last_error, refused_at) VALUES"
                f" ({message_id}, 'e', 'r', '{{}}', x'00000000', x'', 0, 1e308, 'refused', 0)"
            )
    db.close()
    with pytest.raises(OutboxError, match="3 refused rows show as message_id 'x\ufffd'"):
        store.discard("x\ufffd")
    discarded = store.discard("x\udcff")  # b"x\xff", as os.fsdecode gives it from argv
    assert discarded is not None and discarded.message_id == "x\ufffd"
    assert store.retry("x\udcfe") == 1
    assert store.discard("x\udcfe") is not None
    gone = store.discard("x\ufffd")  # now only the row whose message_id is that text
    assert gone is not None and store.status().pending == 0
    store.close()
