"""Which rows a relay publishes, and when (pure: no I/O).

A key's rows go out in id order (its commit order, :mod:`amqp_lab.outbox.schema`), one at a
time: a row is handed to the publisher only once the broker confirmed the key's previous row -
also across batches: a relay may lease the next rows of a key it holds while the key's earlier
chain is still in flight, and that chain is deferred until the earlier one is confirmed to its
end (dropped, untried, if it fails).
Publisher confirms say a message is in its queues, so the key's messages are enqueued in that
order, and the shard's consumer applies them in it. Rows of different keys - and rows without
a key - are independent and go out pipelined.

Only a key's *head* (its pending row with the smallest id) can start a chain, and whoever
holds the head's lease owns the key: another relay skips the key until the head is sent. When
a row fails, its chain stops there: the key's later rows wait behind it (they are released
untried), and nothing else does.

:func:`plan` builds a batch's chains from the candidates a relay's query found,
:func:`cut` trims them to the rows its lease really got (a cancel or another writer can take
a row between the two statements), and :class:`ChainRun` hands out each chain's next row as
the previous one settles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Candidate", "ChainRun", "cut", "plan"]


@dataclass(frozen=True)
class Candidate:
    """A pending row the relay's query found: ``id``, ``key`` (None: no order), ``size`` in
    bytes and ``ready`` (due, not in a refused row's wait, not leased by another relay, not in
    flight here)."""

    id: int
    key: str | None
    size: int
    ready: bool = True


def plan(
    heads: Sequence[Candidate],
    followers: Sequence[Candidate],
    max_rows: int,
    max_bytes: int,
) -> list[list[int]]:
    """The batch's chains (row ids): one per head, in the order given, each followed by the
    rows of its key after it in id order, up to the first that is not ready (a row not yet due
    holds the key's later ones). At most ``max_rows`` rows and ``max_bytes`` bytes in all, but
    always the first head (a row larger than the budget still goes, alone). Heads take the
    budget first; their followers fill what is left, key by key."""
    if max_rows < 1 or max_bytes < 1:
        raise ValueError("max_rows and max_bytes must be >= 1")
    chains: list[list[int]] = []
    keys: list[str | None] = []
    rows = size = 0
    starts: dict[str, int] = {}  # key -> its head's id
    for head in heads:
        if chains and (rows + 1 > max_rows or size + head.size > max_bytes):
            break
        if head.key is not None and head.key in starts:
            continue  # one chain per key
        chains.append([head.id])
        keys.append(head.key)
        rows, size = rows + 1, size + head.size
        if head.key is not None:
            starts[head.key] = head.id
    by_key: dict[str, list[Candidate]] = {}
    for row in followers:
        if row.key is not None and row.key in starts and row.id > starts[row.key]:
            by_key.setdefault(row.key, []).append(row)
    for chain, key in zip(chains, keys, strict=True):
        for row in sorted(by_key.get(key, []) if key is not None else [], key=lambda r: r.id):
            if not row.ready or rows + 1 > max_rows or size + row.size > max_bytes:
                break
            chain.append(row.id)
            rows, size = rows + 1, size + row.size
    return chains


def cut(chains: Sequence[Sequence[int]], leased: set[int]) -> tuple[list[list[int]], list[int]]:
    """``chains`` trimmed at their first row the lease did not get (a chain without its head
    is dropped); and the leased rows after a cut, to be released untried: publishing them
    would skip the missing one."""
    kept: list[list[int]] = []
    released: list[int] = []
    for chain in chains:
        for i, row_id in enumerate(chain):
            if row_id not in leased:
                released.extend(r for r in chain[i + 1 :] if r in leased)
                chain = chain[:i]
                break
        if chain:
            kept.append(list(chain))
    return kept, released


class ChainRun:
    """The chains of one batch in flight: :meth:`start` gives every chain's first row,
    :meth:`settle` the next row of the settled one's chain once it was sent (None when the
    chain is over, or stopped by a failure). Rows never handed out are :meth:`unattempted`."""

    def __init__(self, chains: Sequence[Sequence[int]]) -> None:
        self._chains = [list(c) for c in chains if c]
        self._place: dict[int, tuple[int, int]] = {}
        for c, chain in enumerate(self._chains):
            for p, row_id in enumerate(chain):
                if row_id in self._place:
                    raise ValueError(f"row {row_id} is in two chains")
                self._place[row_id] = (c, p)
        self._out: set[int] = set()  # handed out, not settled
        self._settled: set[int] = set()
        self._stopped: set[int] = set()  # chains stopped by a failure
        self._deferred: set[int] = set()  # chains waiting for their key's earlier rows

    def start(self, defer: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """Every chain's first row (hand them to the publisher now), but the chains whose
        first row is in ``defer``: they wait for :meth:`resume` (their key's earlier rows are
        still in flight in another batch) or :meth:`drop`."""
        heads = []
        for c, chain in enumerate(self._chains):
            if chain[0] in defer:
                self._deferred.add(c)
            else:
                heads.append(chain[0])
        self._out.update(heads)
        return heads

    def resume(self, first: int) -> int:
        """Hand out the deferred chain starting at ``first``; its first row."""
        c, _ = self._place[first]
        self._deferred.remove(c)
        self._out.add(first)
        return first

    def drop(self, first: int) -> None:
        """Give up the deferred chain starting at ``first``: its rows stay unattempted."""
        c, _ = self._place[first]
        self._deferred.discard(c)

    def settle(self, row_id: int, sent: bool) -> int | None:
        """Record ``row_id``'s outcome (``sent``: the broker confirmed it); the chain's next
        row to hand out, or None. Raises KeyError for a row not handed out."""
        if row_id not in self._out:
            raise KeyError(f"row {row_id} is not in flight")
        self._out.discard(row_id)
        self._settled.add(row_id)
        c, p = self._place[row_id]
        chain = self._chains[c]
        if not sent:
            self._stopped.add(c)
            return None
        if p + 1 < len(chain):
            self._out.add(chain[p + 1])
            return chain[p + 1]
        return None

    @property
    def in_flight(self) -> int:
        """Rows handed out and not settled."""
        return len(self._out)

    @property
    def done(self) -> bool:
        """Whether no row is in flight and none is left to hand out (no chain deferred)."""
        return not self._out and not self._deferred

    def last(self, row_id: int) -> bool:
        """Whether ``row_id`` is the last row of its chain."""
        c, p = self._place[row_id]
        return p + 1 == len(self._chains[c])

    def unattempted(self) -> list[int]:
        """Rows never handed out: behind a failure, or in a chain abandoned mid-way."""
        return [r for r in self._place if r not in self._settled and r not in self._out]

    def rows(self) -> list[int]:
        """Every row of the batch."""
        return list(self._place)
