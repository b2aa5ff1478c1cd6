"""The cluster crash test's pure parts: what happened around each quorum queue leader kill,
computed from timestamps (used by lab.chaos_cluster and lab.leader_kills; no I/O here).

Times are epoch seconds (``time.time()``) taken on this machine: the orchestrator's kill time,
the publisher's hand-over and outcome times, and the workers' handler-start and settlement
times, so they compare directly.

* **Resume time** of a kill: from the kill to the settlement (effect applied or duplicate
  skipped, basic.ack sent) of the first delivery a worker began more than ``guard`` seconds
  after the kill (``started``: when its dedup transaction began, right after it arrived). A
  worker holds at most ``prefetch`` deliveries (1 in the cluster run), so what it finishes
  right after the kill was sent before it; the guard (50 ms) keeps a delivery that was already
  on the wire, or waited for a busy CPU, from counting as a resumed one. A quorum queue
  delivers nothing until a new leader is elected
  (https://www.rabbitmq.com/docs/quorum-queues#leader-election), which takes hundreds of
  milliseconds, so the guard does not hide a real resume.
* **Outstanding confirms** at a kill: publishes handed to the publisher at or before the kill
  whose outcome came after it. Each one's fate: ``confirmed_later`` (the broker confirmed it
  on the connection that was open at the kill, once the queue had a new leader), ``retried``
  (the publisher's connection died with it unconfirmed and the publisher published it again
  on another node, where it was confirmed), ``failed`` (an error outcome: not confirmed,
  reported to the caller), ``unresolved`` (no outcome by the end of the run; a defect).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

RESUME_GUARD = 0.05  # seconds: deliveries a worker started this soon after a kill were in flight

FATES = ("confirmed_later", "retried", "failed", "unresolved")


@dataclass(frozen=True)
class PublishRecord:
    """One publish (a deliberate duplicate is a second record with the same message_id):
    ``sent_at`` when it was handed to the publisher, ``done_at`` when its outcome arrived (None:
    never), ``confirmed`` (basic.ack) or not, and ``reconnects`` the publisher had made when
    the outcome arrived."""

    message_id: str
    sent_at: float
    done_at: float | None = None
    confirmed: bool = False
    reconnects: int = 0


@dataclass(frozen=True)
class Settled:
    """One delivery of ``message_id`` a worker settled: ``started`` when the worker began it
    (its dedup transaction; None: not known), ``at`` when it was reported settled, whether
    the broker flagged it ``redelivered``, and whether dedup found it a ``duplicate`` (an
    effect applied before: acked, not applied again)."""

    started: float | None
    at: float
    redelivered: bool = False
    message_id: str | None = None
    duplicate: bool = False


@dataclass(frozen=True)
class Kill:
    """One leader kill: ``node`` was SIGKILLed at ``at`` while ``leader_before`` was the queue's
    leader; ``reconnects`` is the publisher's reconnect count just before it."""

    node: str
    leader_before: str
    at: float
    reconnects: int


def resume_time(
    kill_at: float, settled: Sequence[Settled], guard: float = RESUME_GUARD
) -> float | None:
    """Seconds from ``kill_at`` to the settlement of the first delivery a worker began more
    than ``guard`` s after it and whose settlement stood (no later redelivery of its
    message_id: a worker whose node died can still report a delivery it read before the
    socket closed, and its basic.ack never arrived); None when there was none (the
    consumers never resumed)."""
    redone: dict[str, float] = {}  # message_id -> its last redelivery's settlement
    for s in settled:
        if s.redelivered and s.message_id is not None:
            redone[s.message_id] = max(s.at, redone.get(s.message_id, s.at))
    after = [
        s.at
        for s in settled
        if s.started is not None
        and s.started > kill_at + guard
        and not (s.message_id in redone and redone[s.message_id] > s.at)
    ]
    return round(min(after) - kill_at, 3) if after else None


def first_confirm(records: Iterable[PublishRecord], kill_at: float) -> float | None:
    """Seconds from ``kill_at`` to the first confirm of a publish handed over after it (when
    publishing worked again); None when none was confirmed."""
    done = [r.done_at for r in records if r.confirmed and r.done_at and r.sent_at > kill_at]
    return round(min(done) - kill_at, 3) if done else None


def outstanding_at(records: Iterable[PublishRecord], at: float) -> list[PublishRecord]:
    """The publishes handed over at or before ``at`` whose outcome had not arrived by then."""
    return [r for r in records if r.sent_at <= at and (r.done_at is None or r.done_at > at)]


def fate(record: PublishRecord, reconnects_at_kill: int) -> str:
    """What became of a publish outstanding at a kill (one of :data:`FATES`)."""
    if record.done_at is None:
        return "unresolved"
    if not record.confirmed:
        return "failed"
    return "retried" if record.reconnects > reconnects_at_kill else "confirmed_later"


def confirm_fates(records: Iterable[PublishRecord], kill: Kill) -> dict[str, Any]:
    """``outstanding`` at the kill, how many of them met each fate, and ``last_outcome_s``:
    seconds from the kill to the last of their outcomes (None: none outstanding or none
    resolved). A confirm a few milliseconds after the kill was sent by the old leader before
    it died; one after the election comes from the new leader."""
    outstanding = outstanding_at(records, kill.at)
    counts: dict[str, Any] = {"outstanding": len(outstanding)} | dict.fromkeys(FATES, 0)
    for record in outstanding:
        counts[fate(record, kill.reconnects)] += 1
    done = [r.done_at for r in outstanding if r.done_at is not None]
    counts["last_outcome_s"] = round(max(done) - kill.at, 3) if done else None
    return counts


def confirmed_ids(records: Iterable[PublishRecord]) -> list[str]:
    """message_ids with at least one confirmed publish: each must be applied exactly once."""
    return sorted({r.message_id for r in records if r.confirmed})


def redelivered_between(settled: Iterable[Settled], start: float, end: float) -> int:
    """Deliveries flagged redelivered that were settled in [``start``, ``end``)."""
    return sum(1 for s in settled if s.redelivered and start <= s.at < end)


def kill_reports(
    kills: Sequence[Kill],
    records: Sequence[PublishRecord],
    settled: Sequence[Settled],
    guard: float = RESUME_GUARD,
) -> list[dict[str, Any]]:
    """One dict per kill (in kill order): ``node``, ``leader_before``, ``hit_leader`` (the
    killed node hosted the leader), ``resume_s`` (None: never resumed), ``first_confirm_s``
    (:func:`first_confirm`), ``redelivered``
    (redelivered deliveries settled from this kill to the next, or to the end), and the
    outstanding confirms' fates."""
    ends = [k.at for k in kills[1:]] + [float("inf")]
    return [
        {
            "node": k.node,
            "leader_before": k.leader_before,
            "hit_leader": k.node == k.leader_before,
            "resume_s": resume_time(k.at, settled, guard),
            "first_confirm_s": first_confirm(records, k.at),
            "redelivered": redelivered_between(settled, k.at, end),
        }
        | confirm_fates(records, k)
        for k, end in zip(kills, ends, strict=True)
    ]


def failover_holds(summary: dict[str, Any], kills: Sequence[dict[str, Any]], wanted: int) -> bool:
    """The cluster run's invariant: nothing lost, nothing applied twice, ``wanted`` kills made,
    each of them while publishing and consuming (``publishing``, ``consuming``), on the
    leader's node and followed by a new leader on another node
    (``leader_after``), the consumers resumed after each, no publish left without an outcome
    and no ``publisher_error`` (the publisher stopped early or never finished). Redeliveries
    are not required: a kill whose node carried no worker's connection need not cause any,
    since a consumer on a live node keeps its unacknowledged deliveries across a leader
    change."""
    return (
        summary["lost"] == 0
        and summary["applied_twice"] == 0
        and len(kills) == wanted
        and all(k["hit_leader"] and k["resume_s"] is not None for k in kills)
        and all(k.get("publishing") and k.get("consuming") for k in kills)
        and all(k.get("leader_after") not in (None, k["node"]) for k in kills)
        and all(k["unresolved"] == 0 for k in kills)
        and summary.get("publisher_error") is None
    )
