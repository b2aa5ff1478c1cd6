"""The ordered crash test's pure parts (scripts/chaos.py --ordered): the message plan (N
messages over K keys, each with its per-key sequence number), which messages fail on their
first try, and the summary with the per-key order invariant.

Invariant of a safe ordered run: per key, the ledger rows (in applied order) are the key's
confirmed sequence numbers in increasing order, each once: nothing ``lost`` (a confirmed
message neither applied nor in the DLQ), nothing ``applied_twice``, no key ``out_of_order``
(its first applications are not strictly increasing in seq), and ``redeliveries_seen > 0``
shows the kills and closes really made the broker redeliver.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

KeySeq = tuple[str, int]


def ordered_plan(messages: int, keys: int, prefix: str = "k") -> list[KeySeq]:
    """``messages`` (key, seq) pairs in publish order, round-robin over ``keys`` keys named
    ``{prefix}{n:03d}``; each key's seq counts 1, 2, 3... in publish order."""
    width = max(3, len(str(keys - 1)))
    return [(f"{prefix}{i % keys:0{width}d}", i // keys + 1) for i in range(messages)]


def ordered_message_id(key: str, seq: int) -> str:
    """The message_id of a key's seq-th message: ``{key}-{seq}``."""
    return f"{key}-{seq}"


def parse_message_id(message_id: str) -> KeySeq | None:
    """(key, seq) back from :func:`ordered_message_id`; None for an id of another shape."""
    key, _, seq = message_id.rpartition("-")
    return (key, int(seq)) if key and seq.isdigit() else None


def fails_first_try(seq: int, every: int, remainder: int = 3) -> bool:
    """Whether the message with this seq raises TransientError on its first try:
    ``seq % every == remainder % every`` (``every`` 0: none)."""
    return every > 0 and seq % every == remainder % every


def out_of_order_keys(applied: Iterable[KeySeq]) -> list[str]:
    """Keys whose applied sequence (first application of each seq, in applied order) is not
    strictly increasing, in order of first appearance."""
    last: dict[str, int] = {}
    seen: set[KeySeq] = set()
    bad: dict[str, None] = {}
    for key, seq in applied:
        if (key, seq) in seen:
            continue  # a second application: applied_twice, not an order question
        seen.add((key, seq))
        if key in last and seq <= last[key]:
            bad[key] = None
        last[key] = max(seq, last.get(key, seq))
    return list(bad)


def ordered_summary(
    published: Iterable[KeySeq],
    applied: Iterable[KeySeq],
    dlq_ids: Iterable[str],
    redeliveries: int = 0,
) -> dict[str, Any]:
    """The ordered run's counts: ``published_confirmed``, ``keys``, ``ledger_rows``, ``lost``
    (confirmed, neither applied nor in the DLQ), ``applied_twice`` ((key, seq) with more than
    one row), ``out_of_order`` (keys, :func:`out_of_order_keys`), ``in_dlq`` (confirmed ones
    in the DLQ, counted as not lost), ``redeliveries_seen`` and ``out_of_order_sample`` (up
    to 5 such keys with their applied seqs)."""
    wanted = set(published)
    rows = list(applied)
    counts = Counter(rows)
    dead = {p for p in map(parse_message_id, dlq_ids) if p is not None} & wanted
    bad = out_of_order_keys(rows)
    return {
        "published_confirmed": len(wanted),
        "keys": len({key for key, _ in wanted}),
        "ledger_rows": len(rows),
        "lost": sum(1 for m in wanted if m not in counts and m not in dead),
        "applied_twice": sum(1 for n in counts.values() if n > 1),
        "out_of_order": len(bad),
        "in_dlq": len(dead),
        "redeliveries_seen": redeliveries,
        "out_of_order_sample": {k: [s for key, s in rows if key == k] for k in bad[:5]},
    }


def ordered_invariant_holds(summary: dict[str, Any]) -> bool:
    """Nothing lost, nothing applied twice, every key in order, and redelivery happened."""
    zero = ("lost", "applied_twice", "out_of_order")
    return all(summary[k] == 0 for k in zero) and int(summary["redeliveries_seen"]) > 0
