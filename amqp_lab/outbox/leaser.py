"""A relay's leases, taken on the relay's loop (SQLite) or ahead of it on a thread and a
database connection of their own (PostgreSQL).

A lease on PostgreSQL is one ``UPDATE ... FOR UPDATE SKIP LOCKED`` of up to ``batch_rows``
heads plus the Python that turns them into a batch: measured on a 2-core host with the broker
on it (docs/benchmarks.md, "The outbox"), 55-60 ms per 500 rows, two thirds of the relay
loop's time, during which nothing else ran - no confirm was settled, no chain handed on, no
batch recorded, so the publisher sat idle. :class:`Leaser` runs the lease while the loop goes
on: the loop :meth:`~Leaser.submit` s a :class:`LeaseRequest` - a snapshot of what it holds -
and later :meth:`~Leaser.take` s the :class:`LeaseResult`. One request at a time.

Why a snapshot is enough: only a lease adds rows or keys to what a relay holds, and only one
is outstanding, so what the relay holds when the result arrives is at most what the request
excluded - the lease may skip rows it could have taken, never take one in flight. The one
thing that can go stale is a continuation (the next rows of a key still running,
:meth:`amqp_lab.outbox.store.OutboxStore.lease_after`): its key's chain may have failed
meanwhile, and then the continuation must not go. :func:`stale_chains` names those chains;
the relay releases them untried.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field

from amqp_lab.errors import OutboxError, OutboxUnavailable
from amqp_lab.outbox.lease import Lease
from amqp_lab.outbox.outcomes import describe
from amqp_lab.outbox.sql import key_order
from amqp_lab.outbox.store import OutboxStore

__all__ = [
    "AHEAD_REACH",
    "HeldBack",
    "LeaseRequest",
    "LeaseResult",
    "Leaser",
    "lease_once",
    "stale_chains",
]

log = logging.getLogger("amqp_lab.outbox.relay")

AHEAD_REACH = 2
"""A lease taken ahead looks for heads among the oldest due rows, at most the relay's rows in
flight plus this many batches of them (:meth:`OutboxStore.lease` ``reach``): they lie in
front, and the rows behind them are often its keys' next ones. Unbounded, a lease ahead with
every key held read the whole backlog to find nothing: 30 ms with 19,000 rows pending, 75-85
ms with 99,000, each time the relay tried one, holding the database and the leaser thread
(the relay's next lease waited behind it: with 1,000 keys, 8% fewer msg/s than with no
lease ahead at all). What a lease ahead misses further on, the relay's next lease (after a
batch is recorded) finds."""


@dataclass(frozen=True)
class LeaseRequest:
    """One lease for ``owner``, ``seconds`` long on the database's clock: at most ``max_rows``
    rows and ``max_bytes`` bytes, none of ``exclude`` (row ids held) and no head of a key in
    ``held``; when no head is due, the next rows of the keys in ``tails`` (key -> the last
    row id leased of it, while its chain runs) - unless ``ahead``: taken while every batch
    of the relay is in flight, for the batch to start once one finishes, it leases due heads
    only (a continuation's chains would wait behind the running ones: a batch of them goes
    at one confirm round trip per row)."""

    owner: str
    seconds: float
    max_rows: int
    max_bytes: int
    exclude: tuple[int, ...] = ()
    held: tuple[str, ...] = ()
    tails: Mapping[str, int] = field(default_factory=dict)
    ahead: bool = False


@dataclass(frozen=True)
class LeaseResult:
    """What a :class:`LeaseRequest` got: a ``lease`` (empty when nothing was due;
    ``continuation`` when its rows follow keys in flight), ``next_due`` (seconds until a
    pending row becomes due, when nothing was leased; None: none ahead), or the ``error``
    the store raised (OutboxUnavailable: retry later; any other: the relay stops)."""

    request: LeaseRequest
    lease: Lease = field(default_factory=Lease)
    continuation: bool = False
    next_due: float | None = None
    error: BaseException | None = None


def lease_once(store: OutboxStore, request: LeaseRequest) -> LeaseResult:
    """Run ``request`` on ``store``: the due heads (:meth:`OutboxStore.lease`), or when there
    are none the continuation of its tails (:meth:`OutboxStore.lease_after`), or when that is
    empty too the next due time (:meth:`OutboxStore.next_due`). Returns store errors in the
    result (never raises them); other exceptions propagate."""
    r = request
    reach = len(r.exclude) + AHEAD_REACH * r.max_rows if r.ahead else None
    try:
        lease = store.lease(
            r.owner, r.seconds, r.max_rows, r.max_bytes, r.exclude, r.held, reach=reach
        )
        continuation = False
        if not lease.rows and r.tails and not r.ahead:
            heads = lease
            lease = store.lease_after(r.owner, r.seconds, dict(r.tails), r.max_rows, r.max_bytes)
            lease.blocked, lease.more_behind = heads.blocked, heads.more_behind
            continuation = True
        wait = None if lease.rows else store.next_due(r.exclude)
    except OutboxError as e:
        return LeaseResult(r, error=e)
    return LeaseResult(r, lease, continuation, wait)


def stale_chains(result: LeaseResult, failed: Set[str]) -> set[int]:
    """The first rows of ``result``'s chains that must not go: in a continuation, every
    chain whose key's earlier chain failed while the lease was out (``failed``: those keys).
    The key's failed row holds it, so its next rows wait behind it; they are released
    untried. A key whose chain ended sent meanwhile may go on: its continuation starts right
    after the confirmed row."""
    if not result.continuation:
        return set()
    lease, seen = result.lease, result.request.tails
    stale = set()
    for chain in lease.chains:
        key = lease.rows[chain[0]].ordering_key
        if key is None or key in failed or key not in seen:
            stale.add(chain[0])
    return stale


class HeldBack:
    """The keys a relay's last leases found holding back due rows (:attr:`Lease.blocked`),
    which its next leases skip; forgotten together ``ttl`` seconds after the first was
    found, or after the last lease that ran out of rounds (``extend``: leases crossing a long
    backlog keep every key found until they are through), so a key whose refused head's
    retry comes, or whose scheduled head falls due, is looked at again within that."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._until = 0.0

    def add(self, keys: list[str], now: float, ttl: float, extend: bool = False) -> None:
        """Remember ``keys`` (``now``: monotonic seconds; ``ttl``: seconds); ``extend``: keep
        every key remembered until ``ttl`` after ``now``."""
        if keys and not self._keys:
            self._until = now + ttl
        elif extend:
            self._until = max(self._until, now + ttl)
        self._keys.update(keys)

    def keys(self, now: float) -> tuple[str, ...]:
        """The keys to skip now, sorted."""
        if now >= self._until:
            self._keys.clear()
        return tuple(sorted(self._keys, key=key_order))


class Leaser:
    """Runs a relay's :class:`LeaseRequest` s. ``open_store`` None: inline, on the store
    :meth:`submit` is given (the result is ready at once). Otherwise on a daemon thread with
    the store ``open_store()`` opens there (its own connection; reopened after an outage by
    the store itself), calling ``wake()`` when a result is ready. One request at a time:
    :meth:`submit` raises RuntimeError while one is :attr:`pending`."""

    def __init__(
        self, open_store: Callable[[], OutboxStore] | None, wake: Callable[[], None]
    ) -> None:
        self._open_store, self._wake = open_store, wake
        self._store: OutboxStore | None = None
        self._requests: queue.SimpleQueue[LeaseRequest | None] = queue.SimpleQueue()
        self._result: LeaseResult | None = None
        self._pending = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def threaded(self) -> bool:
        """Whether leases run on a thread of their own."""
        return self._open_store is not None

    @property
    def pending(self) -> bool:
        """A request submitted whose result was not taken yet."""
        return self._pending

    def submit(self, store: OutboxStore, request: LeaseRequest) -> None:
        """Start ``request``: on ``store`` now (inline), or on the leaser's thread."""
        if self._pending:
            raise RuntimeError("a lease is outstanding already")
        self._pending = True
        if self._open_store is None:
            self._result = lease_once(store, request)
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name="amqp-lab-outbox-leaser", daemon=True
            )
            self._thread.start()
        self._done.clear()
        self._requests.put(request)

    def waiting(self) -> list[int]:
        """The rows of a result ready and not taken yet (a lease taken ahead, waiting for the
        relay to have room for its batch): the relay renews their lease with its batches'."""
        ready = self._pending and (not self.threaded or self._done.is_set())
        result = self._result if ready else None
        return [] if result is None else list(result.lease.rows)

    def take(self) -> LeaseResult | None:
        """The result of the request submitted, once it is ready (None before)."""
        if not self._pending or (self.threaded and not self._done.is_set()):
            return None
        result, self._result = self._result, None
        self._pending = False
        return result

    def close(self, timeout: float) -> None:
        """Stop the thread, waiting up to ``timeout`` seconds for a lease in progress (its
        rows are the relay's to release: :meth:`OutboxStore.release_all`). A thread still in
        the database after that is left to end on its own (a daemon). A result no one took
        that failed for another reason than an outage is logged as an error, not dropped."""
        thread = self._thread
        if thread is None:
            return
        self._requests.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("a lease still waits for the database; its rows' leases will expire")
            return
        result = self.take()
        error = None if result is None else result.error
        if error is not None and not isinstance(error, OutboxUnavailable):
            log.error("a lease failed as the relay stopped: %s", describe(error))

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                break
            self._result = self._run(request)
            self._done.set()
            self._wake()
        if self._store is not None:
            self._store.close()

    def _run(self, request: LeaseRequest) -> LeaseResult:
        try:
            if self._store is None:
                assert self._open_store is not None
                self._store = self._open_store()
            return lease_once(self._store, request)
        except BaseException as e:  # the store could not be opened, or a defect: the loop's
            return LeaseResult(request, error=e)  # to retry (OutboxUnavailable) or raise
