"""The relay's leases ahead of its loop (amqp_lab.outbox.leaser), the batch a stale
continuation leaves untried (Flight.start's ``drop``), and a lease's windows past the keys
that hold back due rows (amqp_lab.outbox.rounds): no database, no broker."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any, cast

import pytest

from amqp_lab.errors import OutboxError, OutboxUnavailable
from amqp_lab.message import OutgoingMessage
from amqp_lab.outbox import flight as outbox_flight
from amqp_lab.outbox.lease import Lease
from amqp_lab.outbox.leaser import (
    HeldBack,
    Leaser,
    LeaseRequest,
    LeaseResult,
    lease_once,
    stale_chains,
)
from amqp_lab.outbox.observer import NO_RELAY_OBSERVER, RelayConfig
from amqp_lab.outbox.outcomes import Verdict
from amqp_lab.outbox.rounds import LEASE_ROUNDS, rounds
from amqp_lab.outbox.row import OutboxRow, row_values
from amqp_lab.outbox.store import OutboxStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def _row(row_id: int, key: str | None) -> OutboxRow:
    values = row_values(
        OutgoingMessage(body=b"{}", message_id=f"m-{row_id}", exchange="x", routing_key="r")
    )
    return OutboxRow(
        id=row_id,
        message_id=values.message_id,
        ordering_key=key,
        exchange=values.exchange,
        routing_key=values.routing_key,
        properties=values.properties,
        headers=values.headers,
        body=values.body,
        traceparent=None,
        tracestate=None,
        created_at=100.0,
        due_at=None,
        tries=1,
    )


def _lease(*chains: tuple[str | None, list[int]]) -> Lease:
    rows = {row_id: _row(row_id, key) for key, chain in chains for row_id in chain}
    return Lease(rows=rows, chains=[chain for _, chain in chains])


REQUEST = LeaseRequest("r", 30.0, 10, 10**6, tails={"k": 4, "j": 7})


def test_only_a_continuation_whose_keys_chain_failed_meanwhile_is_stale() -> None:
    continuation = LeaseResult(REQUEST, _lease(("k", [5, 6]), ("j", [8])), continuation=True)
    assert stale_chains(continuation, failed=set()) == set()  # ended sent or still running
    assert stale_chains(continuation, failed={"k"}) == {5}  # k's row 4 was refused: 5 waits
    stray = LeaseResult(REQUEST, _lease(("z", [9]), (None, [10])), continuation=True)
    assert stale_chains(stray, failed=set()) == {9, 10}  # no tail the request saw
    heads = LeaseResult(REQUEST, _lease(("k", [5])), continuation=False)
    assert stale_chains(heads, failed={"k"}) == set()  # heads hold their keys already


class Publisher:
    failure = None

    def __init__(self) -> None:
        self.handed: list[str] = []

    def publish_each(self, ready: list[Any]) -> None:
        self.handed.extend(message.message_id for message, _ in ready)

    def publish_sealed(self, plain: list[Any]) -> None:
        self.handed.extend(row.message_id for row, _, _ in plain)


def test_dropped_chains_never_go_and_are_recorded_untried_and_then_runs_before_publishing() -> None:
    flight = outbox_flight.Flight(RelayConfig(), NO_RELAY_OBSERVER, None, lambda: None)
    publisher = Publisher()
    flight.publisher = cast(Any, publisher)
    seen: list[tuple[int, list[str]]] = []
    lease = _lease(("k", [5, 6]), ("j", [8]))
    flight.start(
        lease, drop={5}, then=lambda: seen.append((len(flight.batches), [*publisher.handed]))
    )
    assert seen == [(1, [])]  # the batch counts as in flight; nothing handed over yet
    assert publisher.handed == ["m-8"]
    assert flight.tails() == {"j": 8}  # the dropped chain's key is not running
    flight._on_outcome(1, 8, None)
    flight.take_outcomes()
    (batch,) = flight.unrecorded
    assert batch.results[8].verdict is Verdict.SENT
    assert {r: batch.results[r].verdict for r in (5, 6)} == {
        5: Verdict.UNATTEMPTED,
        6: Verdict.UNATTEMPTED,
    }


def test_a_chain_that_fails_names_its_key_until_the_relay_clears_it() -> None:
    flight = outbox_flight.Flight(RelayConfig(), NO_RELAY_OBSERVER, None, lambda: None)
    flight.publisher = cast(Any, Publisher())
    flight.start(_lease(("k", [5, 6]), ("j", [8])))
    flight._on_outcome(1, 5, OutboxUnavailable("connection lost"))
    flight._on_outcome(1, 8, None)
    flight.take_outcomes()
    assert flight.failed_keys == {"k"}


class FakeStore:
    """The three store calls a lease makes, answering from a script."""

    def __init__(self, heads: Lease, after: Lease | None = None, error: Exception | None = None):
        self.heads, self.after, self.error = heads, after or Lease(), error
        self.calls: list[str] = []
        self.closed = False
        self.release = threading.Event()
        self.release.set()

    def lease(self, *args: Any, **options: Any) -> Lease:
        self.release.wait(10)
        self.calls.append("lease")
        if self.error is not None:
            raise self.error
        return self.heads

    def lease_after(self, *args: Any) -> Lease:
        self.calls.append("lease_after")
        return self.after

    def next_due(self, exclude: Any) -> float | None:
        self.calls.append("next_due")
        return 3.0

    def close(self) -> None:
        self.closed = True


def test_a_lease_takes_heads_else_the_continuation_else_the_next_due_time() -> None:
    heads = FakeStore(_lease(("k", [5])))
    result = lease_once(cast(OutboxStore, heads), REQUEST)
    assert (heads.calls, result.continuation, result.next_due) == (["lease"], False, None)
    follow = FakeStore(Lease(blocked=["b"], more_behind=True), _lease(("k", [5])))
    result = lease_once(cast(OutboxStore, follow), REQUEST)
    assert (follow.calls, result.continuation) == (["lease", "lease_after"], True)
    # what the heads' lease found holding back rows is the relay's to skip all the same
    assert (result.lease.blocked, result.lease.more_behind) == (["b"], True)
    idle = FakeStore(Lease())
    result = lease_once(cast(OutboxStore, idle), REQUEST)
    assert idle.calls == ["lease", "lease_after", "next_due"] and result.next_due == 3.0
    ahead = FakeStore(Lease(), _lease(("k", [5])))  # every batch in flight: heads only
    result = lease_once(cast(OutboxStore, ahead), replace(REQUEST, ahead=True))
    assert ahead.calls == ["lease", "next_due"] and not result.lease.rows
    assert not result.continuation
    down = FakeStore(Lease(), error=OutboxUnavailable("the server is restarting"))
    result = lease_once(cast(OutboxStore, down), REQUEST)
    assert isinstance(result.error, OutboxUnavailable) and not result.lease.rows


def test_a_lease_ahead_runs_on_its_own_thread_wakes_the_loop_and_takes_one_request() -> None:
    woken = threading.Event()
    store = FakeStore(_lease(("k", [5])))
    store.release.clear()  # the database is slow
    leaser = Leaser(lambda: cast(OutboxStore, store), woken.set)
    loop_store = cast(OutboxStore, object())  # never used by a threaded leaser
    leaser.submit(loop_store, REQUEST)
    assert leaser.pending and leaser.take() is None
    assert leaser.waiting() == []  # not leased yet: nothing to renew
    with pytest.raises(RuntimeError):
        leaser.submit(loop_store, REQUEST)
    store.release.set()
    assert woken.wait(10)
    assert leaser.waiting() == [5]  # leased, its batch not started: the relay renews it
    result = leaser.take()
    assert result is not None and list(result.lease.rows) == [5] and not leaser.pending
    assert leaser.waiting() == []
    leaser.close(10)
    assert store.closed


def test_a_lease_ahead_hands_over_a_store_that_cannot_be_opened_or_fails() -> None:
    woken = threading.Event()

    def refuse() -> OutboxStore:
        raise OutboxUnavailable("connection refused")

    leaser = Leaser(refuse, woken.set)
    leaser.submit(cast(OutboxStore, object()), REQUEST)
    assert woken.wait(10)
    result = leaser.take()
    assert result is not None and isinstance(result.error, OutboxUnavailable)
    leaser.close(10)
    woken.clear()
    broken = FakeStore(Lease(), error=OutboxError("permission denied for table"))
    leaser = Leaser(lambda: cast(OutboxStore, broken), woken.set)
    leaser.submit(cast(OutboxStore, object()), REQUEST)
    assert woken.wait(10)
    result = leaser.take()
    assert result is not None and isinstance(result.error, OutboxError)
    leaser.close(10)


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        (OutboxError("permission denied for table amqp_lab_outbox"), True),
        (OutboxUnavailable("the server closed the connection"), False),
    ],
)
def test_a_lease_that_failed_as_the_relay_stopped_is_logged_not_dropped(
    caplog: pytest.LogCaptureFixture, error: Exception, logged: bool
) -> None:
    """The relay stops with a lease out; the lease fails for another reason than an
    outage (a defect, a permission taken away): no loop takes it any more, so closing says
    it. An outage's failure is nothing to report: the next relay leases again."""
    woken = threading.Event()
    store = FakeStore(Lease(), error=error)
    leaser = Leaser(lambda: cast(OutboxStore, store), woken.set)
    leaser.submit(cast(OutboxStore, object()), REQUEST)
    assert woken.wait(10)
    with caplog.at_level(logging.ERROR, logger="amqp_lab.outbox.relay"):
        leaser.close(10)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    if logged:
        assert len(errors) == 1 and "permission denied for table" in errors[0], errors
        assert errors[0].startswith("a lease failed as the relay stopped: ")
    else:
        assert errors == []
    assert not leaser.pending


def test_an_inline_lease_is_ready_at_once_on_the_loops_store() -> None:
    store = FakeStore(_lease(("k", [5])))
    leaser = Leaser(None, lambda: None)
    leaser.submit(cast(OutboxStore, store), REQUEST)
    assert leaser.waiting() == [5]
    result = leaser.take()
    assert result is not None and list(result.lease.rows) == [5] and not leaser.threaded
    leaser.close(1)  # nothing to stop


def test_a_lease_looks_past_held_back_keys_and_tries_the_heads_that_can_go() -> None:
    """Windows of the due rows, oldest first; k's rows fill the first (its head is refused),
    j's head sorts after its own rows (retried): j's head is taken directly, k is skipped."""
    windows = [[], ["o1"], []]
    calls: list[tuple[list[str], list[str]]] = []

    def take(keys: list[str], skip: list[str], limit: int) -> list[str]:
        calls.append(([*keys], [*skip]))
        if keys:
            return [f"{key}-head" for key in keys]
        return windows.pop(0)[:limit]

    def blocked_of(skip: list[str]) -> tuple[list[str], list[str]]:
        return ([], []) if "k" in skip else (["j", "k"], ["j"])

    heads, blocked, more = rounds(take, blocked_of, lambda h: h.split("-")[0], 10, ["held"])
    assert heads == ["j-head", "o1"] and more is False  # the third window held nothing back
    assert calls == [([], ["held"]), (["j"], ["held", "j", "k"]), ([], ["held", "j", "k", "j"])]
    assert blocked == ["k"]  # j is this lease's now


def test_a_lease_stops_after_its_rounds_or_a_full_batch() -> None:
    taken: list[int] = []

    def take(keys: list[str], skip: list[str], limit: int) -> list[str]:
        taken.append(limit)
        return []

    def endless(skip: list[str]) -> tuple[list[str], list[str]]:
        return [f"k{len(skip)}"], []

    heads, blocked, more = rounds(take, endless, lambda h: h, 5, [])
    assert heads == [] and len(taken) == LEASE_ROUNDS and len(blocked) == LEASE_ROUNDS
    assert more is True  # the last window was still full: the relay leases again at once
    full, _, more = rounds(lambda k, s, n: ["a", "b"][:n], endless, lambda h: h, 2, [])
    assert full == ["a", "b"] and more is False


def test_held_back_keys_are_skipped_until_forgotten_together() -> None:
    held = HeldBack()
    held.add([], 0.0, 1.0)
    assert held.keys(0.0) == ()
    held.add(["k"], 10.0, 1.0)
    held.add(["j"], 10.5, 1.0)  # joins k: both forgotten at 11.0
    assert held.keys(10.9) == ("j", "k")
    assert held.keys(11.0) == ()
    held.add(["k"], 12.0, 1.0)
    assert held.keys(12.5) == ("k",)


def test_held_back_keys_live_on_while_leases_run_out_of_rounds() -> None:
    """A backlog behind more held-back keys than one lease's rounds cross: each lease
    that runs out of rounds (``extend``) keeps every key found until ``ttl`` after it, so the
    next lease starts past them instead of at the first window again."""
    held = HeldBack()
    held.add(["a", "b"], 10.0, 0.1, extend=True)
    held.add(["c", "d"], 10.09, 0.1, extend=True)
    held.add(["e"], 10.18, 0.1, extend=True)
    assert held.keys(10.25) == ("a", "b", "c", "d", "e")
    held.add(["f"], 10.26, 0.1)  # through: no longer extended
    assert held.keys(10.27) == ("a", "b", "c", "d", "e", "f")
    assert held.keys(10.28) == ()
