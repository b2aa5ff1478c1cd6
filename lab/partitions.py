"""The partition chaos's pure parts (lab.chaos_partition runs them): which faults, on which
node, for how long; and the per-fault report and the run's invariant, computed from
timestamps. No I/O here. Times are epoch seconds taken on this machine, as in lab.failover.

Two kinds of fault, each on one node of the three:

* **partition** - the node's container is cut off the cluster network (``docker network
  disconnect``, then ``connect``): the node lives on, its clients keep their connections to it,
  and it can reach neither other node. It is the minority.
* **pause** - the node's container is frozen (``docker pause``, then ``unpause``): nothing on it
  runs; its kernel still accepts connections and buffers what arrives.

How long each lasts follows the timers in play (:class:`Timers`), so that the outcome it is
there for has surely happened before it ends (docs/cluster.md#partitions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.failover import Kill, PublishRecord, Settled, kill_reports

PARTITION, PAUSE = "partition", "pause"
LEADER, PUBLISHER, CONSUMER = "leader", "publisher", "consumer"
MARGIN = 3.0  # seconds a fault outlasts the bound it is there to cross
SHORT_PAUSE = 3.0  # seconds at most for a pause nobody is to notice

REFUSALS = ("nacked", "timed_out", "lost")


@dataclass(frozen=True)
class Timers:
    """The failure-detection timers in play, in seconds: the nodes' ``net_ticktime`` (a peer
    silent for 0.75-1.25 times it is down: https://www.rabbitmq.com/docs/nettick), the quorum
    queue's ``consumer_disconnected_timeout`` (how long its leader keeps the deliveries of a
    consumer whose node it cannot reach before returning them:
    https://www.rabbitmq.com/docs/quorum-queues#disconnected-consumer-node-timeout), the
    clients' ``heartbeat`` (pika closes a connection that received nothing for between
    heartbeat + 5 and 2 * (heartbeat + 5) s) and the publisher's ``confirm_timeout`` (None:
    none)."""

    net_ticktime: float
    consumer_disconnected_timeout: float
    heartbeat: float
    confirm_timeout: float | None = None

    @property
    def detected_by(self) -> float:
        """Seconds after which the other nodes have surely declared a silent node down."""
        return 1.25 * self.net_ticktime

    @property
    def silent_for_long(self) -> float:
        """Seconds after which every client of a frozen node has surely given it up."""
        return 2 * (self.heartbeat + 5)

    @property
    def unnoticed_below(self) -> float:
        """Seconds of silence that no node and no client acts on yet."""
        bounds = [0.75 * self.net_ticktime, self.heartbeat + 5]
        return min([*bounds, self.confirm_timeout] if self.confirm_timeout else bounds)

    def as_dict(self) -> dict[str, float | None]:
        return {
            "net_ticktime": self.net_ticktime,
            "consumer_disconnected_timeout": self.consumer_disconnected_timeout,
            "heartbeat": self.heartbeat,
            "confirm_timeout": self.confirm_timeout,
        }


@dataclass(frozen=True)
class Step:
    """One planned fault: ``kind`` (partition or pause) of the node that has ``role`` (the
    queue's leader, the publisher's node, a consumer's node other than the leader's), held
    ``hold`` seconds; ``long``: past the detection bounds (else a stall meant to go unnoticed)."""

    kind: str
    role: str
    hold: float
    long: bool = True


def plan(partitions: int, pauses: int, timers: Timers, margin: float = MARGIN) -> list[Step]:
    """``partitions`` partitions and ``pauses`` pauses, alternating (partition first).

    Partitions cut off the leader's node, then a consumer's node, in turn; each lasts until
    the others have declared it down and the leader has returned the deliveries a consumer on
    it held (``detected_by + consumer_disconnected_timeout + margin``). Pauses freeze the
    publisher's node past every detection bound (``max(detected_by, silent_for_long) +
    margin``: a pause longer than heartbeats), then the leader's node for less than any bound
    (half of ``unnoticed_below``, at most :data:`SHORT_PAUSE`: a stall), in turn."""
    cut = timers.detected_by + timers.consumer_disconnected_timeout + margin
    frozen = max(timers.detected_by, timers.silent_for_long) + margin
    stall = min(SHORT_PAUSE, timers.unnoticed_below / 2)
    cuts = [Step(PARTITION, (LEADER, CONSUMER)[i % 2], cut) for i in range(partitions)]
    freezes = [
        Step(PAUSE, PUBLISHER, frozen) if i % 2 == 0 else Step(PAUSE, LEADER, stall, long=False)
        for i in range(pauses)
    ]
    steps: list[Step] = []
    for i in range(max(partitions, pauses)):
        steps += cuts[i : i + 1] + freezes[i : i + 1]
    return steps


@dataclass(frozen=True)
class FaultPlan:
    """The faults of a run (:func:`plan`) and the timers they were planned for."""

    timers: Timers
    steps: tuple[Step, ...]

    def describe(self) -> str:
        kinds = [s.kind for s in self.steps]
        return (
            f"{kinds.count(PARTITION)} partitions and {kinds.count(PAUSE)} pauses, timers "
            + ", ".join(f"{k} {v}" for k, v in self.timers.as_dict().items())
        )


@dataclass
class Fault:
    """One fault as it happened: ``step`` on ``node`` (an Erlang node name) from ``at`` (when
    the docker call began) until healed, ``held_s`` later (measured on the monotonic clock,
    so a step of the wall clock cannot stretch it); what the node carried then (the queue's leader
    ``leader_before``, the publisher's connection, ``workers_on_node`` worker connections as
    the management API listed them), whether a portion was being handed over
    (``publishing``) and a worker had just settled a delivery (``consuming``); the publisher's
    ``reconnects`` and refusal counters at ``at`` and at the end of the fault's window (the
    next fault, or the end of the run); ``detected_s`` (the first other node's log declared it
    down; None: never), ``rejoined_s`` (heal until the cluster was whole and the queue had
    every member online again) and the leader afterwards."""

    step: Step
    node: str
    at: float
    leader_before: str | None
    reconnects: int
    refused_before: dict[str, int]
    publisher_on_node: bool = False
    workers_on_node: int = 0
    publishing: bool = False
    consuming: bool = False
    held_s: float | None = None
    detected_s: float | None = None
    rejoined_s: float | None = None
    leader_after: str | None = None
    refused_after: dict[str, int] = field(default_factory=dict)

    def facts(self) -> dict[str, Any]:
        refused = self.refused_after or self.refused_before
        return {
            "kind": self.step.kind,
            "role": self.step.role,
            "long": self.step.long,
            "hold_s": None if self.held_s is None else round(self.held_s, 1),
            "detected_s": self.detected_s,
            "rejoined_s": self.rejoined_s,
            "leader_after": self.leader_after,
            "publisher_on_node": self.publisher_on_node,
            "workers_on_node": self.workers_on_node,
            "publishing": self.publishing,
            "consuming": self.consuming,
            "refused": {k: refused.get(k, 0) - self.refused_before.get(k, 0) for k in REFUSALS},
        }


def fault_reports(
    faults: Sequence[Fault], records: Sequence[PublishRecord], settled: Sequence[Settled]
) -> list[dict[str, Any]]:
    """One dict per fault, in order: lab.failover.kill_reports' figures under the names of
    this run (``confirms_resumed_s``: the first confirm of a publish handed over after the
    fault began; ``deliveries_resumed_s``: the first delivery begun after it whose settlement
    stood; ``redelivered``, ``duplicates`` and ``redelivered_duplicates`` (a delivery whose
    effect was applied before, typically by a consumer whose basic.ack never reached the
    leader) settled in the fault's window; the confirms outstanding at the fault and their
    fates) and :meth:`Fault.facts`."""
    kills = [Kill(f.node, f.leader_before or "", f.at, f.reconnects) for f in faults]
    ends = [f.at for f in faults[1:]] + [math.inf]
    reports = []
    for fault, report, end in zip(faults, kill_reports(kills, records, settled), ends, strict=True):
        report["confirms_resumed_s"] = report.pop("first_confirm_s")
        report["deliveries_resumed_s"] = report.pop("resume_s")
        report["on_leader"] = report.pop("hit_leader") and fault.leader_before is not None
        window = [s for s in settled if fault.at <= s.at < end]
        report["duplicates"] = sum(1 for s in window if s.duplicate)
        report["redelivered_duplicates"] = sum(1 for s in window if s.duplicate and s.redelivered)
        reports.append(report | fault.facts())
    return reports


def partition_holds(
    summary: dict[str, Any], reports: Sequence[dict[str, Any]], wanted: int
) -> bool:
    """The partition run's invariant: nothing lost, nothing applied twice, ``wanted`` faults
    made; after each, confirms and deliveries resumed, the cluster was whole again, and no
    publish was left without an outcome; each long fault was declared down by another node
    (else it was no partition); the publisher did not stop early and the queue was drained."""
    return (
        summary["lost"] == 0
        and summary["applied_twice"] == 0
        and len(reports) == wanted
        and all(r["confirms_resumed_s"] is not None for r in reports)
        and all(r["deliveries_resumed_s"] is not None for r in reports)
        and all(r["rejoined_s"] is not None and r["unresolved"] == 0 for r in reports)
        and all(r["detected_s"] is not None for r in reports if r["long"])
        and summary.get("publisher_error") is None
        and summary.get("left_in_queue") == 0
    )
