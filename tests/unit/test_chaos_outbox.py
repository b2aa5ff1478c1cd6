"""The outbox crash test's summary (lab.chaos_outbox) counts what it must: each kind of
violation in a made-up run is found, named, and only it."""

from __future__ import annotations

import pytest

from lab.chaos_outbox import Applied, Committed, outbox_invariant_holds, outbox_summary

pytestmark = pytest.mark.unit

COMMITTED = [
    Committed("o1", "k"),
    Committed("o2", "j"),
    Committed("o3", "k", due_at=100.0),
    Committed("o4", "k", due_at=100.0, cancelled="yes"),
    Committed("o5", "j", due_at=100.0, cancelled="maybe"),
]


def clean() -> list[Applied]:
    a = [Applied("a", m, k, 200.0) for m, k in (("o1", "k"), ("o2", "j"), ("o3", "k"))]
    b = [Applied("b", f"b:{r.message_id}", r.key, 201.0) for r in a]
    return a + b


def counts(
    applied: list[Applied], rolled_back: frozenset[str] = frozenset({"o9"})
) -> dict[str, int]:
    summary = outbox_summary(COMMITTED, set(rolled_back), applied)
    return {
        k: summary[k]
        for k in ("lost", "phantom", "applied_twice", "out_of_order", "scheduled_early")
    }


def test_a_clean_run_holds() -> None:
    summary = outbox_summary(COMMITTED, {"o9"}, clean())
    assert outbox_invariant_holds(summary)
    assert (summary["cancelled"], summary["cancelled_after_try"], summary["keys"]) == (1, 1, 2)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda rows: [r for r in rows if r.message_id not in ("o2", "b:o2")], {"lost": 1}),
        (lambda rows: [r for r in rows if r.message_id != "o2"], {"lost": 1, "phantom": 1}),
        (lambda rows: [r for r in rows if r.message_id != "b:o2"], {"lost": 1}),
        (lambda rows: [*rows, Applied("a", "o9", "k", 300.0)], {"phantom": 1, "lost": 1}),
        (lambda rows: [*rows, Applied("a", "o4", "k", 300.0)], {"phantom": 1, "lost": 1}),
        (lambda rows: [*rows, Applied("b", "b:o7", "k", 300.0)], {"phantom": 1}),
        (lambda rows: [*rows, Applied("a", "o1", "k", 300.0)], {"applied_twice": 1}),
        # stage A applied k's o3 before o1, and stage B followed it: A is out of order
        (lambda rows: [rows[i] for i in (2, 0, 1, 5, 3, 4)], {"out_of_order": 1}),
        # stage A in order, stage B not
        (lambda rows: [rows[i] for i in (0, 1, 2, 5, 3, 4)], {"out_of_order": 1}),
        (
            lambda rows: [
                Applied("a", "o3", "k", 99.0) if r.message_id == "o3" else r for r in rows
            ],
            {"scheduled_early": 1},
        ),
    ],
)
def test_each_violation_is_counted(change, expected) -> None:  # type: ignore[no-untyped-def]
    got = counts(change(clean()))
    assert {k: v for k, v in got.items() if v} == expected


def test_a_later_commit_with_a_smaller_id_is_out_of_order() -> None:
    """What a relay publishing in insert (id) order would do when the transaction that
    inserted first committed last: the summary reads the commit order, not the ids."""
    committed = [Committed("late-insert-early-commit", "k"), Committed("early-insert", "k")]
    ids = ["early-insert", "late-insert-early-commit"]
    by_id = [Applied("a", m, "k") for m in ids] + [Applied("b", f"b:{m}", "k") for m in ids]
    summary = outbox_summary(committed, set(), by_id)
    assert summary["out_of_order"] == 1 and summary["out_of_order_keys"] == {"a": ["k"], "b": []}
