"""The outbox crash test's invariant (scripts/chaos.py --outbox), as pure functions.

Producers commit business rows (``orders``) with an outbox message each, or roll the
transaction back; some messages are scheduled (``due_at``), some of those cancelled. Stage A
applies each message (a ``ledger`` row) and, in the same transaction, adds a follow-up to its
own outbox for stage B, which applies it too. The truth comes from the databases after the
run: the committed orders in commit order (PostgreSQL: ``pg_xact_commit_timestamp``; SQLite:
rowid, under its one writer), the cancels that committed, and both stages' ledgers in applied
order. :func:`outbox_summary` counts, over both stages:

* ``lost`` - committed (and not cancelled) but never applied; a stage-A message whose
  follow-up stage B never applied;
* ``phantom`` - applied though its transaction rolled back, or it was cancelled, or (stage
  B) its stage-A message was never applied;
* ``applied_twice`` - a message_id with more than one ledger row;
* ``out_of_order`` - keys whose first applications are not in their commit order (stage A)
  or in stage A's applied order (stage B); ``out_of_order_keys`` names them;
* ``scheduled_early`` - a scheduled message applied before its due time.

A cancel that answered ``cancelled-after-try`` (a relay had leased the row: a copy may have
reached the broker) may go either way: such a message is neither lost nor phantom, and counted
apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Applied", "Committed", "follow_up_id", "outbox_invariant_holds", "outbox_summary"]

ZEROES = ("lost", "phantom", "applied_twice", "out_of_order", "scheduled_early")


@dataclass(frozen=True)
class Committed:
    """A committed order: its message's id, key and due time (None: at once); ``cancelled``
    is ``no``, ``yes`` (cancel answered ``cancelled``) or ``maybe`` (``cancelled-after-try``)."""

    message_id: str
    key: str
    due_at: float | None = None
    cancelled: str = "no"


@dataclass(frozen=True)
class Applied:
    """A ledger row: ``stage`` (a or b), ``message_id``, ``key``, ``applied_at`` (epoch
    seconds, the handler's clock), in applied order."""

    stage: str
    message_id: str
    key: str
    applied_at: float = 0.0


def follow_up_id(message_id: str) -> str:
    """Stage A's follow-up of ``message_id`` (its message_id at stage B)."""
    return f"b:{message_id}"


def _first_order(rows: Iterable[Applied]) -> dict[str, list[str]]:
    """Per key, the message_ids in the order of their first application."""
    seen: set[str] = set()
    order: dict[str, list[str]] = {}
    for row in rows:
        if row.message_id not in seen:
            seen.add(row.message_id)
            order.setdefault(row.key, []).append(row.message_id)
    return order


def outbox_summary(
    committed: list[Committed], rolled_back: set[str], applied: list[Applied]
) -> dict[str, Any]:
    """The counts of the module doc. ``committed`` in commit order, ``applied`` in applied
    order (both stages mixed)."""
    stage_a = [r for r in applied if r.stage == "a"]
    stage_b = [r for r in applied if r.stage == "b"]
    counts = Counter((r.stage, r.message_id) for r in applied)
    by_id = {c.message_id: c for c in committed}
    must = {c.message_id for c in committed if c.cancelled == "no"}
    cancelled = {c.message_id for c in committed if c.cancelled == "yes"}
    maybe = {c.message_id for c in committed if c.cancelled == "maybe"}
    applied_a = {r.message_id for r in stage_a}
    applied_b = {r.message_id for r in stage_b}
    lost_a = must - applied_a
    lost_b = {m for m in applied_a if follow_up_id(m) not in applied_b}
    phantom_a = {m for m in applied_a if m in rolled_back or m in cancelled or m not in by_id}
    phantom_b = {m for m in applied_b if not m.startswith("b:") or m[2:] not in applied_a}
    first_a, first_b = _first_order(stage_a), _first_order(stage_b)
    bad_a, bad_b = [], []  # phantoms are counted as such, not as out of order too
    for key, got in sorted(first_a.items()):
        real = [m for m in got if m in by_id]
        if real != [c.message_id for c in committed if c.key == key and c.message_id in real]:
            bad_a.append(key)
    for key, got in sorted(first_b.items()):
        real = [m for m in got if m.startswith("b:") and m[2:] in applied_a]
        if real != [follow_up_id(m) for m in first_a.get(key, []) if follow_up_id(m) in real]:
            bad_b.append(key)
    early = [
        r.message_id
        for r in stage_a
        if r.message_id in by_id
        and by_id[r.message_id].due_at is not None
        and r.applied_at < (by_id[r.message_id].due_at or 0.0)
    ]
    return {
        "committed": len(committed),
        "rolled_back": len(rolled_back),
        "scheduled": sum(1 for c in committed if c.due_at is not None),
        "cancelled": len(cancelled),
        "cancelled_after_try": len(maybe),
        "cancelled_after_try_applied": len(maybe & applied_a),
        "keys": len({c.key for c in committed}),
        "applied_a": len(applied_a),
        "applied_b": len(applied_b),
        "lost": len(lost_a) + len(lost_b),
        "phantom": len(phantom_a) + len(phantom_b),
        "applied_twice": sum(1 for n in counts.values() if n > 1),
        "out_of_order": len(bad_a) + len(bad_b),
        "out_of_order_keys": {"a": bad_a, "b": bad_b},
        "scheduled_early": len(early),
        "examples": {
            "lost": sorted(lost_a | {follow_up_id(m) for m in lost_b})[:5],
            "phantom": sorted(phantom_a | phantom_b)[:5],
            "scheduled_early": early[:5],
        },
    }


def outbox_invariant_holds(summary: dict[str, Any]) -> bool:
    """Every count of :data:`ZEROES` is 0 and something was applied."""
    return all(summary[name] == 0 for name in ZEROES) and summary["applied_a"] > 0
