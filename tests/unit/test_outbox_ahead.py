"""A relay whose batches are all in flight leases the next one ahead: due heads only (never
a continuation, whose chains would wait behind the running ones), its result waiting in the
leaser - renewed with the batches' rows - until a batch finishes, then started before the
finished batch is recorded. No database, no broker: the relay's loop steps run by hand."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, cast

import pytest

from amqp_lab.errors import PublishFailed
from amqp_lab.outbox.lease import Lease
from amqp_lab.outbox.leaser import AHEAD_REACH, Leaser
from amqp_lab.outbox.observer import RelayConfig
from amqp_lab.outbox.relay import OutboxRelay
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings
from tests.unit.test_outbox_leaser import _lease

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Store:
    """The store calls of a relay's leases and renewals, answering leases from a script."""

    dialect = "postgresql"
    lock_path = None
    pooled = False

    def __init__(self, *leases: Lease) -> None:
        self.leases = list(leases)
        self.calls: list[tuple[str, Any]] = []
        self.recorded: list[list[int]] = []
        self.reaches: list[int | None] = []

    def lease(
        self,
        owner: str,
        seconds: float,
        rows: int,
        size: int,
        exclude: Any,
        held: Any,
        reach: int | None = None,
    ) -> Lease:
        self.calls.append(("lease", (tuple(exclude), tuple(held))))
        self.reaches.append(reach)
        return self.leases.pop(0) if self.leases else Lease()

    def lease_after(self, owner: str, seconds: float, tails: dict[str, int], *args: Any) -> Lease:
        self.calls.append(("lease_after", dict(tails)))
        return Lease()

    def next_due(self, exclude: Any) -> float | None:
        self.calls.append(("next_due", None))
        return None

    def renew(self, owner: str, ids: Any, seconds: float) -> int:
        self.calls.append(("renew", sorted(ids)))
        return len(ids)

    def complete(self, owner: str, results: Any, keep_sent: bool) -> None:
        self.recorded.append(sorted(r.row_id for r in results))
        self.calls.append(("complete", sorted((r.row_id, r.verdict.value) for r in results)))

    def release_all(self, owner: str, keep: Any = ()) -> None:
        self.calls.append(("release_all", sorted(keep)))

    def forget_relay(self, owner: str) -> None:
        self.calls.append(("forget_relay", None))

    def close(self) -> None:
        pass


class Publisher:
    failure = None

    def __init__(self) -> None:
        self.handed: list[str] = []
        self.outcomes: dict[str, Any] = {}

    def publish_sealed(self, plain: list[Any]) -> None:
        for row, _, callback in plain:
            self.handed.append(row.message_id)
            self.outcomes[row.message_id] = callback

    def publish_each(self, ready: list[Any]) -> None:  # pragma: no cover - rows are plain
        raise AssertionError("every row here is plain")

    def close(self, flush_timeout: float = 60) -> None:
        pass


def _relay(store: Store, batches: int) -> tuple[OutboxRelay, Publisher, threading.Event]:
    relay = OutboxRelay(
        BrokerSettings("amqp://guest:guest@127.0.0.1:1/%2F"),
        "postgresql://nowhere/outbox",
        RelayConfig(batches=batches, batch_rows=1),  # every lease full: lease again
    )
    woken = threading.Event()
    relay._store = cast(OutboxStore, store)
    relay._leaser = Leaser(lambda: cast(OutboxStore, store), woken.set)
    relay.flight.publisher = publisher = Publisher()  # type: ignore[assignment]
    relay._next_status = time.monotonic() + 3600  # no status rounds here
    return relay, publisher, woken


def _leased(relay: OutboxRelay, woken: threading.Event) -> None:
    """Wait for the leaser's result to be ready (not taken)."""
    assert woken.wait(10)
    woken.clear()


def test_a_full_relay_leases_heads_ahead_and_starts_them_when_a_batch_finishes() -> None:
    store = Store(_lease(("k", [1])), _lease(("j", [2])))
    relay, publisher, woken = _relay(store, batches=1)
    relay._lease()  # room: leased now (on the leaser's thread)
    assert relay._leaser.pending
    _leased(relay, woken)
    assert relay._leased()  # batch A starts, and its start submits the next lease ahead
    assert publisher.handed == ["m-1"]
    _leased(relay, woken)
    # ahead: heads only, without k (held) - no continuation of k asked for
    assert store.calls == [("lease", ((), ())), ("lease", ((1,), ("k",)))]
    # ... among at most the row in flight and two batches of the oldest due rows
    assert store.reaches == [None, 1 + AHEAD_REACH * 1]
    assert not relay._leased() and relay._leaser.pending  # no room: it waits, leased
    assert relay._leaser.waiting() == [2]
    relay._next_renew = 0.0
    relay._housekeeping()
    assert store.calls[-1] == ("renew", [1, 2])  # its lease is renewed with the batch's
    publisher.outcomes["m-1"](None, None)  # A is confirmed
    assert relay.flight.take_outcomes()
    assert relay._leased()  # B starts at once ...
    assert publisher.handed == ["m-1", "m-2"]
    assert store.recorded == []  # ... before A is recorded
    assert relay._record() and store.recorded == [[1]]


def test_a_relay_with_room_asks_for_the_continuation_of_the_keys_in_flight() -> None:
    store = Store(_lease(("k", [1])))
    relay, _, woken = _relay(store, batches=2)
    relay._lease()
    _leased(relay, woken)
    assert relay._leased()  # one batch of two: the next lease is no lease ahead
    _leased(relay, woken)
    assert store.calls[1:] == [
        ("lease", ((1,), ("k",))),
        ("lease_after", {"k": 1}),  # no head due: k's next rows, to go after row 1
        ("next_due", None),  # none either
    ]
    assert store.reaches == [None, None]  # leases with room read as far as they need
    assert relay._leaser.waiting() == []  # empty leases are no rows to renew
    assert not relay._leased() and not relay._leaser.pending  # the empty result, taken


def test_a_lease_ahead_that_finds_no_head_asks_for_no_continuation() -> None:
    """Every key held: a continuation taken ahead would only wait behind the running chains
    (measured: 3,700 msg/s against 10,000 over 1,000 keys, docs/benchmarks.md)."""
    store = Store(_lease(("k", [1])))
    relay, _, woken = _relay(store, batches=1)
    relay._lease()
    _leased(relay, woken)
    assert relay._leased()
    _leased(relay, woken)
    assert [name for name, _ in store.calls] == ["lease", "lease", "next_due"]
    assert not relay._leased() and relay._leaser.waiting() == []
    relay.flight.publisher.outcomes["m-1"](None, None)  # type: ignore[union-attr]
    assert relay.flight.take_outcomes() and not relay._leased()  # the empty result, taken
    assert relay._record()  # k's next row may be a head now: a lease with room goes at once
    relay._lease()
    assert relay._leaser.pending and not relay._lease()


def test_after_an_empty_lease_ahead_the_relay_leases_ahead_again_only_a_second_later() -> None:
    """An empty lease ahead costs the database a scan of the due rows (46-65 ms measured
    with 1,000 keys all held), during which the lease a record frees waits: one a second."""
    store = Store(_lease(("k", [1])), Lease(), _lease(("j", [2])), _lease(("i", [3])))
    relay, _, woken = _relay(store, batches=1)
    relay._lease()
    _leased(relay, woken)
    assert relay._leased()  # k goes; its start leases ahead: nothing
    _leased(relay, woken)
    relay.flight.publisher.outcomes["m-1"](None, None)  # type: ignore[union-attr]
    assert relay.flight.take_outcomes() and not relay._leased()  # the empty result, taken
    assert relay._ahead_after > time.monotonic() + 0.5
    assert relay._record()
    relay._lease()  # room: leased now, and j starts ...
    _leased(relay, woken)
    assert relay._leased()
    assert not relay._leaser.pending  # ... and no lease ahead follows it
    relay._ahead_after = 0.0  # a second later
    relay._lease()
    assert relay._leaser.pending
    _leased(relay, woken)
    assert store.calls[-1] == ("lease", ((2,), ("j",)))  # k's row recorded: not held
    assert relay._leaser.waiting() == [3]


def test_an_inline_leaser_never_leases_ahead() -> None:
    """SQLite's lease runs on the loop: taken ahead it would hold the loop while batches are
    in flight (measured: 10,100 msg/s against 13,000)."""
    store = Store(_lease(("k", [1])), _lease(("j", [2])))
    relay, publisher, _ = _relay(store, batches=1)
    relay._leaser = Leaser(None, lambda: None)
    assert relay._lease()  # inline: leased and started at once
    assert publisher.handed == ["m-1"]
    assert not relay._lease() and [name for name, _ in store.calls] == ["lease"]


def test_a_batch_leased_ahead_waits_for_a_working_publisher_its_rows_renewed() -> None:
    """The publisher is dropped (a batch waited too long for its confirms) and the broker
    cannot be reached for a while: the batch leased ahead does not start only to have every
    row settled lost; it waits, leased and renewed, and goes once a publisher works."""
    store = Store(_lease(("k", [1])), _lease(("j", [2])))
    relay, publisher, woken = _relay(store, batches=1)
    relay._lease()
    _leased(relay, woken)
    assert relay._leased()
    _leased(relay, woken)
    relay.flight.drop_publisher()
    relay.flight._publisher_ok_at = time.monotonic() + 60  # the next try to connect
    publisher.outcomes["m-1"](None, PublishFailed("the publisher was closed"))
    assert relay.flight.take_outcomes() and not relay.flight.batches  # k's row: lost
    assert not relay._leased()
    assert relay._leaser.waiting() == [2] and relay.flight.lost == 1
    relay._next_renew = 0.0
    relay._housekeeping()
    assert store.calls[-1] == ("renew", [2])
    relay.flight.publisher = again = Publisher()  # type: ignore[assignment]
    assert relay._leased() and again.handed == ["m-2"]


def test_a_relay_stopped_while_a_batch_leased_ahead_waits_releases_it_unpublished() -> None:
    """Stopped with a batch in flight and the next one leased ahead, waiting for room: the
    batch in flight is drained and recorded, the one waiting never starts (nothing of it
    reaches the publisher), and every lease the relay holds is released - the waiting rows
    go to the next relay at once instead of after their lease expires."""
    store = Store(_lease(("k", [1])), _lease(("j", [2])))
    relay, publisher, woken = _relay(store, batches=1)
    relay.config = replace(relay.config, drain_timeout=1.0)
    relay._lease()
    _leased(relay, woken)
    assert relay._leased()
    _leased(relay, woken)
    assert relay._leaser.waiting() == [2]  # j, leased ahead, waits for room
    publisher.outcomes["m-1"](None, None)  # k is confirmed ...
    relay.stop()
    relay._shutdown()  # ... and the relay stops before the loop takes it
    assert publisher.handed == ["m-1"]  # j never went
    assert ("complete", [(1, "sent")]) in store.calls  # k recorded sent
    assert store.calls[-2:] == [("release_all", []), ("forget_relay", None)]
    assert relay.sent == 1 and relay.lost == 0
