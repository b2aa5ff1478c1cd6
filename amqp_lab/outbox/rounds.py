"""A lease's windows, round after round (pure: no I/O).

A lease looks for due heads in a window of the oldest due rows. A window can be full of rows
that are no heads - a key whose head was refused and waits, or is not due yet, has its later
rows due behind it - and then every other key's rows are out of sight. :func:`rounds` drives
the lease past such keys: the next window skips them, and their heads that can go now are
tried directly (:mod:`amqp_lab.outbox.leasing` runs the statements).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["LEASE_ROUNDS", "rounds"]

T = TypeVar("T")

LEASE_ROUNDS = 8
"""Most windows one lease looks through (:func:`~amqp_lab.outbox.sql.blocked_sql`): each
skips the keys that held back the last one's rows. The relay carries the keys found
(:attr:`Lease.blocked`) into its next leases for a second, and while a lease runs out of
rounds (:attr:`Lease.more_behind`) it leases again at once and keeps them all, so a backlog
behind many held-back keys is crossed lease by lease."""


def rounds(
    take: Callable[[list[str], list[str], int], list[T]],
    blocked_of: Callable[[list[str]], tuple[list[str], list[str]]],
    key_of: Callable[[T], str | None],
    max_rows: int,
    held: Sequence[str],
) -> tuple[list[T], list[str], bool]:
    """A lease's heads, window after window (at most :data:`LEASE_ROUNDS`): ``take(keys,
    skip, limit)`` takes at most ``limit`` heads - of ``keys`` when given, else of the
    window without the keys in ``skip``. After a window short of ``max_rows``,
    ``blocked_of(skip)`` names the keys holding back its rows, and those of them whose head
    can go now (a key's head retried or falling due sorts after its own due rows): those
    heads are tried directly, and the next window skips every such key. Returns the heads,
    the keys still holding back rows, and whether the rounds ran out with the last window
    still full of held-back rows (what lies beyond it is for the next lease)."""
    heads: list[T] = []
    skip, blocked, ready = list(held), list[str](), list[str]()
    more = False
    for round_no in range(LEASE_ROUNDS):
        for keys in (ready, []) if ready else ([],):
            found = take(keys, skip, max_rows - len(heads))
            heads += found
            if len(heads) >= max_rows:
                break
            skip += [k for k in map(key_of, found) if k is not None]
        if len(heads) >= max_rows:
            break
        found_blocked, ready = blocked_of(skip)
        if not found_blocked:
            break
        blocked += found_blocked
        skip += found_blocked
        more = round_no == LEASE_ROUNDS - 1
    mine = {key_of(h) for h in heads}
    return heads, [k for k in blocked if k not in mine], more
