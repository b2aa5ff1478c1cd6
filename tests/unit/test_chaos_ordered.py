"""lab.chaos_ordered: the ordered crash test's plan and its per-key order invariant."""

from __future__ import annotations

import pytest

from lab.chaos_ordered import (
    fails_first_try,
    ordered_invariant_holds,
    ordered_message_id,
    ordered_plan,
    ordered_summary,
    parse_message_id,
)

pytestmark = pytest.mark.unit

PUBLISHED = [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]


def test_the_plan_numbers_each_key_in_publish_order() -> None:
    assert ordered_plan(5, 2) == [("k000", 1), ("k001", 1), ("k000", 2), ("k001", 2), ("k000", 3)]
    assert ordered_plan(3, 1, prefix="run.k") == [("run.k000", 1), ("run.k000", 2), ("run.k000", 3)]


def test_message_ids_round_trip_even_with_dashes_in_the_key() -> None:
    assert ordered_message_id("chaos-1a.k007", 12) == "chaos-1a.k007-12"
    assert parse_message_id("chaos-1a.k007-12") == ("chaos-1a.k007", 12)
    assert parse_message_id("no-seq-x") is None
    assert parse_message_id("12") is None


def test_every_seventh_fails_first() -> None:
    assert [s for s in range(1, 25) if fails_first_try(s, 7)] == [3, 10, 17, 24]
    assert not any(fails_first_try(s, 0) for s in range(1, 25))


def test_in_order_passes() -> None:
    applied = [("a", 1), ("a", 2), ("b", 1), ("a", 3), ("b", 2)]  # interleaved keys are fine
    summary = ordered_summary(PUBLISHED, applied, [], redeliveries=2)
    assert {k: summary[k] for k in ("lost", "applied_twice", "out_of_order", "in_dlq")} == {
        "lost": 0,
        "applied_twice": 0,
        "out_of_order": 0,
        "in_dlq": 0,
    }
    assert (summary["published_confirmed"], summary["keys"], summary["ledger_rows"]) == (5, 2, 5)
    assert ordered_invariant_holds(summary)


def test_a_swap_is_flagged_out_of_order() -> None:
    applied = [("a", 2), ("a", 1), ("b", 1), ("a", 3), ("b", 2)]
    summary = ordered_summary(PUBLISHED, applied, [], redeliveries=1)
    assert (summary["out_of_order"], summary["lost"], summary["applied_twice"]) == (1, 0, 0)
    assert summary["out_of_order_sample"] == {"a": [2, 1, 3]}
    assert not ordered_invariant_holds(summary)


def test_a_duplicate_is_applied_twice_not_out_of_order() -> None:
    applied = [("a", 1), ("a", 2), ("a", 2), ("b", 1), ("b", 2), ("a", 3)]
    summary = ordered_summary(PUBLISHED, applied, [], redeliveries=1)
    assert (summary["applied_twice"], summary["out_of_order"], summary["lost"]) == (1, 0, 0)
    assert not ordered_invariant_holds(summary)


def test_a_loss_is_flagged_unless_dead_lettered() -> None:
    applied = [("a", 1), ("a", 3), ("b", 1), ("b", 2)]  # a-2 missing: a gap
    lost = ordered_summary(PUBLISHED, applied, [], redeliveries=1)
    assert (lost["lost"], lost["out_of_order"], lost["in_dlq"]) == (1, 0, 0)
    assert not ordered_invariant_holds(lost)
    dead = ordered_summary(PUBLISHED, applied, ["a-2", "unrelated-id"], redeliveries=1)
    assert (dead["lost"], dead["in_dlq"]) == (0, 1)
    assert ordered_invariant_holds(dead)


def test_no_redelivery_means_the_run_proved_nothing() -> None:
    applied = [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]
    assert not ordered_invariant_holds(ordered_summary(PUBLISHED, applied, [], redeliveries=0))
