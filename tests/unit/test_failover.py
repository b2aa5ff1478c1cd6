"""The cluster crash test's pure parts (lab.failover): resume times, outstanding confirms and
their fate, the per-kill report and the invariant; plus the portions of the publishing plan,
the address check and the worker output's timestamps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.errors import ConfigurationError
from amqp_lab.settings import BrokerSettings
from lab.chaos import OutputTally
from lab.chaos_cluster import check_addresses
from lab.failover import (
    Kill,
    PublishRecord,
    Settled,
    confirm_fates,
    confirmed_ids,
    failover_holds,
    first_confirm,
    kill_reports,
    outstanding_at,
    resume_time,
)
from lab.leader_kills import portions

pytestmark = pytest.mark.unit

KILL_AT = 100.0


def test_resume_time_skips_deliveries_begun_before_the_kill_or_within_the_guard() -> None:
    settled = [
        Settled(started=99.99, at=100.02),  # began before the kill: its tail, not a resume
        Settled(started=100.03, at=100.04),  # began 30 ms after: was on the wire already
        Settled(started=None, at=100.5),  # begin time unknown: not counted
        Settled(started=100.70, at=100.75),  # the first real one
        Settled(started=100.60, at=100.90),  # began earlier, settled later: not first settled
        Settled(started=101.0, at=101.1),
    ]
    assert resume_time(KILL_AT, settled) == 0.75
    assert resume_time(KILL_AT, settled, guard=0.0) == 0.04
    assert resume_time(KILL_AT, settled[:3]) is None  # the consumers never resumed
    assert resume_time(KILL_AT, []) is None


def test_a_settlement_that_did_not_stand_is_no_resume() -> None:
    """A worker on the killed node reports a delivery it read before its socket closed; the
    broker never got the basic.ack and redelivers the message later: not a resume."""
    settled = [
        Settled(100.08, 100.10, False, "m-1"),  # stale: m-1 comes back redelivered
        Settled(100.50, 100.55, False, "m-2"),  # the first that stood
        Settled(100.60, 100.65, True, "m-1"),
        Settled(100.70, 100.72, False, "m-3"),  # a deliberate duplicate's first copy ...
        Settled(100.80, 100.82, False, "m-3"),  # ... and its second: both stand
    ]
    assert resume_time(KILL_AT, settled) == 0.55
    assert resume_time(KILL_AT, [s for s in settled if s.message_id != "m-2"]) == 0.65
    assert resume_time(KILL_AT, settled[3:]) == 0.72


def test_first_confirm_counts_only_publishes_handed_over_after_the_kill() -> None:
    records = [
        PublishRecord("old", 99.9, 100.4, True),  # outstanding at the kill: not this one
        PublishRecord("failed", 100.1, 100.5, False),
        PublishRecord("new", 100.2, 107.3, True),
        PublishRecord("newer", 100.3, 107.2, True),
    ]
    assert first_confirm(records, KILL_AT) == 7.2
    assert first_confirm(records[:2], KILL_AT) is None


def test_outstanding_publishes_are_those_handed_over_and_not_resolved_at_the_kill() -> None:
    records = [
        PublishRecord("done-before", 99.0, 99.5, True, 0),
        PublishRecord("resolved-at-the-kill", 99.0, 100.0, True, 0),
        PublishRecord("late-confirm", 99.8, 100.7, True, 0),
        PublishRecord("never", 99.9),
        PublishRecord("after-the-kill", 100.1, 100.2, True, 0),
    ]
    assert [r.message_id for r in outstanding_at(records, KILL_AT)] == ["late-confirm", "never"]


def test_each_outstanding_publish_gets_one_fate() -> None:
    kill = Kill("rabbit@rmq1", "rabbit@rmq1", KILL_AT, reconnects=2)
    records = [
        PublishRecord("a", 99.9, 100.6, True, 2),  # confirmed on the connection of the kill
        PublishRecord("b", 99.9, 103.0, True, 3),  # the connection died: republished, confirmed
        PublishRecord("c", 99.9, 104.0, False, 3),  # an error outcome
        PublishRecord("d", 99.95),  # no outcome at all
        PublishRecord("e", 99.0, 99.1, True, 2),  # confirmed before: not outstanding
    ]
    assert confirm_fates(records, kill) == {
        "outstanding": 4,
        "confirmed_later": 1,
        "retried": 1,
        "failed": 1,
        "unresolved": 1,
        "last_outcome_s": 4.0,  # c's error, 4 s after the kill
    }
    assert confirm_fates(records[4:], kill)["last_outcome_s"] is None  # none outstanding


def test_a_message_is_confirmed_when_one_of_its_publishes_is() -> None:
    records = [
        PublishRecord("m-2", 1.0, 2.0, True),
        PublishRecord("m-1", 1.0, 2.0, False),  # the duplicate's first copy failed ...
        PublishRecord("m-1", 1.1, 2.1, True),  # ... its second was confirmed
        PublishRecord("m-3", 1.0, 2.0, False),
    ]
    assert confirmed_ids(records) == ["m-1", "m-2"]


def reports(*kills: Kill) -> list[dict[str, object]]:
    records = [PublishRecord("x", 99.9, 100.8, True, 0), PublishRecord("y", 100.2, 100.9, True, 0)]
    settled = [Settled(100.6, 100.7, True), Settled(150.0, 150.1, True), Settled(200.9, 201.0)]
    return [
        r | {"leader_after": "rabbit@rmq2", "publishing": True, "consuming": True}
        for r in kill_reports(list(kills), records, settled)
    ]


def test_kill_reports_say_whether_the_kill_hit_the_leader_and_when_consumers_resumed() -> None:
    hit = Kill("rabbit@rmq1", "rabbit@rmq1", KILL_AT, 0)
    missed = Kill("rabbit@rmq1", "rabbit@rmq3", 200.0, 0)  # the leader moved just before
    assert reports(hit, missed) == [
        {
            "node": "rabbit@rmq1",
            "leader_before": "rabbit@rmq1",
            "hit_leader": True,
            "resume_s": 0.7,
            "first_confirm_s": 0.9,  # y, handed over after the kill
            "redelivered": 2,  # settled before the next kill
            "outstanding": 1,
            "confirmed_later": 1,
            "retried": 0,
            "failed": 0,
            "unresolved": 0,
            "last_outcome_s": 0.8,
            "leader_after": "rabbit@rmq2",
            "publishing": True,
            "consuming": True,
        },
        {
            "node": "rabbit@rmq1",
            "leader_before": "rabbit@rmq3",
            "hit_leader": False,
            "resume_s": 1.0,
            "first_confirm_s": None,
            "redelivered": 0,
            "outstanding": 0,
            "confirmed_later": 0,
            "retried": 0,
            "failed": 0,
            "unresolved": 0,
            "last_outcome_s": None,
            "leader_after": "rabbit@rmq2",
            "publishing": True,
            "consuming": True,
        },
    ]


def test_the_failover_invariant() -> None:
    clean = {"lost": 0, "applied_twice": 0, "publisher_error": None}
    good = reports(Kill("rabbit@rmq1", "rabbit@rmq1", KILL_AT, 0))
    assert failover_holds(clean, good, wanted=1) is True
    assert failover_holds(clean | {"lost": 1}, good, 1) is False
    assert failover_holds(clean | {"applied_twice": 1}, good, 1) is False
    assert failover_holds(clean | {"publisher_error": "gave up"}, good, 1) is False
    assert failover_holds(clean, good, wanted=2) is False  # a kill is missing
    assert failover_holds(clean, [good[0] | {"hit_leader": False}], 1) is False
    assert failover_holds(clean, [good[0] | {"resume_s": None}], 1) is False
    assert failover_holds(clean, [good[0] | {"unresolved": 1}], 1) is False
    assert failover_holds(clean, [good[0] | {"leader_after": None}], 1) is False
    assert failover_holds(clean, [good[0] | {"leader_after": "rabbit@rmq1"}], 1) is False
    assert failover_holds(clean, [good[0] | {"publishing": False}], 1) is False  # too late
    assert failover_holds(clean, [good[0] | {"consuming": False}], 1) is False


def test_portions_cover_every_message_one_per_kill_and_the_rest_last() -> None:
    assert portions(200, 2) == [66, 66, 68]
    assert portions(2000, 5) == [333] * 5 + [335]
    assert sum(portions(7, 3)) == 7


def test_the_address_check_wants_every_cluster_node() -> None:
    nodes = [f"amqp://guest:guest@127.0.0.1:{p}/v" for p in (5701, 5702, 5703)]
    check_addresses(BrokerSettings(",".join(reversed(nodes))), nodes)  # any order
    with pytest.raises(ConfigurationError) as e:
        check_addresses(BrokerSettings("amqp://guest:s3cret@127.0.0.1:5672/v"), nodes)
    assert str(e.value) == (
        "--cluster: EAI_AMQP_URL names 127.0.0.1:5672 but not the cluster's 127.0.0.1:5701, "
        "127.0.0.1:5702, 127.0.0.1:5703; list every node: "
        'eval "$(python scripts/cluster.py env --vhost VHOST)"'
    )


def test_the_tally_keeps_the_settlement_times_of_each_report(tmp_path: Path) -> None:
    out = tmp_path / "worker-1-0.out"
    report = DeliveryReport("a", "processed", 1, False).as_dict()
    out.write_text(
        json.dumps(report | {"at": 10.5, "started": 10.25, "redelivered": True})
        + "\n"
        + json.dumps(report | {"at": 11.0, "started": None})
        + "\n"
        + json.dumps(report)  # an older worker's line: counted, no times
        + "\n"
    )
    tally = OutputTally()
    assert tally.update([out]) == 3
    assert tally.settled == [Settled(10.25, 10.5, True, "a"), Settled(None, 11.0, False, "a")]


class _Killed(Exception):
    pass


class _Cluster:
    """The calls ClusterChaos._failover makes before its kill; the kill itself ends the test."""

    def __init__(self) -> None:
        self.kills: list[str] = []

    def queue_leader(self, vhost: str, queue: str) -> str:
        return "rabbit@rmq1"

    def kill(self, node: str) -> None:
        self.kills.append(node)
        raise _Killed(node)


class _Publisher:
    def __init__(self, handed: int, count: int = 200) -> None:
        self.handed, self.reconnects, self.allowed, self.count = handed, 0, 0, count

    def allow(self, messages: int) -> None:
        self.allowed = min(self.count, self.allowed + messages)

    def is_alive(self) -> bool:
        return False


class _Pool:
    def __init__(self, busy: bool) -> None:
        self._busy = busy

    def busy(self, within: float) -> list[str]:
        return ["worker-1"] if self._busy else []


@pytest.mark.parametrize(
    ("handed", "busy", "kills"),
    [(40, True, ["rabbit@rmq1"]), (66, True, []), (40, False, []), (70, True, [])],
    ids=["in-flight", "all-handed-over", "no-worker-busy", "past-the-portion"],
)
def test_a_kill_that_would_find_nothing_in_flight_is_deferred(
    monkeypatch: pytest.MonkeyPatch, handed: int, busy: bool, kills: list[str]
) -> None:
    """CI: the leader and connection lookups took longer than the rest of the portion on a
    loaded machine, the kill found every message consumed, and the run waited 90 s for
    consumers to resume with nothing to consume (publishing=False, consuming=False)."""
    import lab.leader_kills as lk

    cluster = _Cluster()
    chaos = lk.ClusterChaos(
        cluster,  # type: ignore[arg-type]
        BrokerSettings("amqp://guest:guest@127.0.0.1:5999/x"),
        "q:tasks",
        _Publisher(handed),  # type: ignore[arg-type]
        _Pool(busy),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        log=lambda line: None,
    )
    if kills:
        with pytest.raises(_Killed):
            chaos._failover(66, "rabbit@rmq1", [], may_defer=True)
    else:
        assert chaos._failover(66, "rabbit@rmq1", [], may_defer=True) is None
    assert cluster.kills == kills
    with pytest.raises(_Killed):  # the last try kills whatever it finds
        chaos._failover(66, "rabbit@rmq1", [], may_defer=False)


@pytest.mark.parametrize(
    ("late", "ends", "allowed"),
    [
        (set(), [66, 132], [66, 132]),
        ({1}, [66, 82, 148], [66, 82, 148]),  # a quarter of a portion more, then the kill
        ({1, 2, 3}, [66, 82, 98, 164], [66, 82, 98, 164]),  # the last portion keeps half
        ({2}, [66, 132, 148], [66, 132, 148]),
    ],
    ids=["on-time", "first-late", "first-late-twice", "second-late"],
)
def test_a_held_back_kill_publishes_a_quarter_portion_more_taken_from_the_last(
    monkeypatch: pytest.MonkeyPatch, late: set[int], ends: list[int], allowed: list[int]
) -> None:
    """ClusterChaos.run with 200 messages and 2 kills (portions 66, 66, 68): a kill held back
    is aimed at what the publisher was allowed (end == allowed, so ``publishing`` means
    messages still to go), and no deferral eats into the portions of the kills after it or
    into more than half of the last (a kill found late then goes as it is)."""
    import lab.leader_kills as lk

    publisher = _Publisher(0)
    chaos = lk.ClusterChaos(
        _Cluster(),  # type: ignore[arg-type]
        BrokerSettings("amqp://guest:guest@127.0.0.1:5999/x"),
        "q:tasks",
        publisher,  # type: ignore[arg-type]
        type("P", (), {"start_all": lambda self: None})(),
        None,  # type: ignore[arg-type]
        log=lambda line: None,
    )
    calls: list[tuple[int, int, bool]] = []

    def failover(end: int, leader: str, on_node: list[str], may_defer: bool) -> object | None:
        calls.append((end, publisher.allowed, may_defer))
        return None if may_defer and len(calls) in late else object()

    monkeypatch.setattr(chaos, "_wait", lambda what, done, timeout=None: True)
    monkeypatch.setattr(chaos, "_leader", lambda: "rabbit@rmq1")
    monkeypatch.setattr(chaos, "_connections_on", lambda node: [])
    monkeypatch.setattr(chaos, "_failover", failover)
    assert len(chaos.run(2)) == 2
    assert [c[0] for c in calls] == ends and [c[1] for c in calls] == allowed
    assert publisher.allowed == 200  # the last portion went all the same
