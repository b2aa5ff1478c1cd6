"""The partition crash test's pure parts (lab.partitions): the plan of faults and how long each
lasts, the per-fault report and the invariant; the nodes' "node X down" log lines
(lab.cluster_watch) and the worker output's duplicate flag."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.consuming.delivery import DeliveryReport
from lab.chaos import OutputTally
from lab.cluster_watch import down_times
from lab.failover import PublishRecord, Settled
from lab.partitions import (
    CONSUMER,
    LEADER,
    PARTITION,
    PAUSE,
    PUBLISHER,
    Fault,
    FaultPlan,
    Step,
    Timers,
    fault_reports,
    partition_holds,
    plan,
)

pytestmark = pytest.mark.unit

LAB = Timers(net_ticktime=10, consumer_disconnected_timeout=10, heartbeat=5, confirm_timeout=15)
DEFAULTS = Timers(
    net_ticktime=60, consumer_disconnected_timeout=60, heartbeat=30, confirm_timeout=30
)


def test_the_bounds_follow_net_ticktime_and_the_heartbeat() -> None:
    assert (LAB.detected_by, LAB.silent_for_long, LAB.unnoticed_below) == (12.5, 20, 7.5)
    assert (DEFAULTS.detected_by, DEFAULTS.silent_for_long) == (75, 70)
    assert DEFAULTS.unnoticed_below == 30  # the confirm timeout comes first
    no_timeout = Timers(60, 60, 30, None)
    assert no_timeout.unnoticed_below == 35


def test_two_and_two_alternate_and_aim_at_the_nodes_that_matter() -> None:
    steps = plan(2, 2, LAB)
    assert [(s.kind, s.role, s.hold, s.long) for s in steps] == [
        (PARTITION, LEADER, 12.5 + 10 + 3, True),  # past detection and the disconnected timeout
        (PAUSE, PUBLISHER, 20 + 3, True),  # past every client's heartbeat and the detection
        (PARTITION, CONSUMER, 25.5, True),
        (PAUSE, LEADER, 3.0, False),  # a stall: below every bound
    ]


def test_a_stall_stays_below_half_of_the_first_bound() -> None:
    quick = Timers(net_ticktime=4, consumer_disconnected_timeout=1, heartbeat=1, confirm_timeout=2)
    assert plan(0, 2, quick)[1] == Step(PAUSE, LEADER, 1.0, long=False)  # half the 2 s timeout


def test_uneven_counts_keep_alternating_then_append_the_rest() -> None:
    kinds = [s.kind for s in plan(3, 1, LAB)]
    assert kinds == [PARTITION, PAUSE, PARTITION, PARTITION]
    assert [s.role for s in plan(3, 0, LAB)] == [LEADER, CONSUMER, LEADER]
    assert plan(0, 0, LAB) == []


def test_a_plan_describes_itself_for_the_log() -> None:
    faults = FaultPlan(LAB, tuple(plan(2, 2, LAB)))
    assert faults.describe() == (
        "2 partitions and 2 pauses, timers net_ticktime 10, consumer_disconnected_timeout 10, "
        "heartbeat 5, confirm_timeout 15"
    )


def fault(at: float, step: Step | None = None, **facts: Any) -> Fault:
    return Fault(
        step or Step(PARTITION, LEADER, 25.5),
        "rabbit@rmq1",
        at,
        "rabbit@rmq1",
        reconnects=0,
        refused_before={"nacked": 0, "timed_out": 2, "lost": 0},
        **facts,
    )


def test_a_fault_report_times_the_resumption_and_counts_its_window() -> None:
    first = fault(100.0, held_s=25.62, detected_s=11.2, rejoined_s=6.1)
    first.refused_after = {"nacked": 1, "timed_out": 31, "lost": 4}
    second = fault(200.0, Step(PAUSE, PUBLISHER, 23.0), held_s=23.0)
    records = [
        PublishRecord("m-1", sent_at=99.0, done_at=112.0, confirmed=True),  # outstanding
        PublishRecord("m-2", sent_at=101.0, done_at=110.5, confirmed=True),  # first after
        PublishRecord("m-3", sent_at=201.0, done_at=201.2, confirmed=True),
    ]
    settled = [
        Settled(started=111.0, at=111.3, message_id="m-0"),
        Settled(started=121.0, at=121.1, redelivered=True, message_id="m-9", duplicate=True),
        Settled(started=130.0, at=130.1, message_id="m-8", duplicate=True),
        Settled(started=201.5, at=201.6, message_id="m-3"),
    ]
    one, two = fault_reports([first, second], records, settled)
    assert (one["confirms_resumed_s"], one["deliveries_resumed_s"]) == (10.5, 11.3)
    assert (one["outstanding"], one["confirmed_later"], one["unresolved"]) == (1, 1, 0)
    assert (one["redelivered"], one["duplicates"], one["redelivered_duplicates"]) == (1, 2, 1)
    assert one["refused"] == {"nacked": 1, "timed_out": 29, "lost": 4}
    assert (one["kind"], one["role"], one["long"], one["on_leader"]) == (
        PARTITION,
        LEADER,
        True,
        True,
    )
    assert (one["hold_s"], one["detected_s"], one["rejoined_s"]) == (25.6, 11.2, 6.1)
    assert (two["kind"], two["duplicates"], two["deliveries_resumed_s"]) == (PAUSE, 0, 1.6)
    assert two["refused"] == {"nacked": 0, "timed_out": 0, "lost": 0}  # no window end: none
    json.dumps([one, two], allow_nan=False)  # the --json summary stays standard JSON


def report(**changes: Any) -> dict[str, Any]:
    base = {
        "confirms_resumed_s": 1.0,
        "deliveries_resumed_s": 2.0,
        "rejoined_s": 5.0,
        "unresolved": 0,
        "detected_s": 11.0,
        "long": True,
    }
    return base | changes


SUMMARY = {"lost": 0, "applied_twice": 0, "publisher_error": None, "left_in_queue": 0}


def test_the_invariant_holds_when_every_fault_resumed_and_nothing_was_lost() -> None:
    reports = [report(), report(long=False, detected_s=None)]  # a stall need not be detected
    assert partition_holds(SUMMARY, reports, 2) is True


@pytest.mark.parametrize(
    ("summary", "change", "wanted"),
    [
        ({"lost": 1}, {}, 1),
        ({"applied_twice": 1}, {}, 1),
        ({"publisher_error": "gave up"}, {}, 1),
        ({"left_in_queue": 3}, {}, 1),
        ({}, {"confirms_resumed_s": None}, 1),
        ({}, {"deliveries_resumed_s": None}, 1),
        ({}, {"rejoined_s": None}, 1),
        ({}, {"unresolved": 2}, 1),
        ({}, {"detected_s": None}, 1),  # a long fault nobody declared down: no partition
        ({}, {}, 2),  # a planned fault was not made
    ],
)
def test_the_invariant_fails_on_each_missing_piece(
    summary: dict[str, Any], change: dict[str, Any], wanted: int
) -> None:
    assert partition_holds(SUMMARY | summary, [report(**change)], wanted) is False


LOG = """\
2026-12-03 08:16:25.669735+00:00 [warning] <0.1801.0> ** Node rabbit@rmq3: net tick 3/4 missed **
2026-12-03 08:16:33.173174+00:00 [info] <0.796.0> node rabbit@rmq3 down: net_tick_timeout
2026-12-03 08:16:33.173200+00:00 [info] <0.796.0> node rabbit@rmq2 down: net_tick_timeout
2026-12-03 08:16:47.252307+00:00 [info] <0.796.0> node rabbit@rmq3 up
not a log line: node rabbit@rmq3 down
2026-13-03 08:20:00.000000+00:00 [info] <0.796.0> node rabbit@rmq3 down: connection_closed
2026-12-03 08:21:41.145544+00:00 [info] <0.796.0> node rabbit@rmq3 down: connection_closed
"""


def test_down_times_reads_the_node_monitor_lines_of_one_node() -> None:
    at = [
        datetime(2026, 12, 3, 8, 16, 33, 173174, UTC),
        datetime(2026, 12, 3, 8, 21, 41, 145544, UTC),
    ]
    assert down_times(LOG, "rabbit@rmq3") == [t.timestamp() for t in at]
    assert len(down_times(LOG, "rabbit@rmq2")) == 1
    assert down_times(LOG, "rabbit@rmq1") == []


def test_the_tally_keeps_whether_dedup_found_a_delivery_a_duplicate(tmp_path: Path) -> None:
    out = tmp_path / "w.out"
    lines = [
        DeliveryReport("m-1", "processed", 1, False).as_dict() | {"at": 10.0, "started": 9.9},
        DeliveryReport("m-1", "duplicate", 1, True).as_dict() | {"at": 12.0, "started": 11.9},
    ]
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tally = OutputTally()
    tally.update([out])
    assert [(s.duplicate, s.redelivered) for s in tally.settled] == [(False, False), (True, True)]
