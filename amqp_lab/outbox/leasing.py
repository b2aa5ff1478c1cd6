"""A relay's leases (psycopg 3 or sqlite3): which rows a relay takes, how, and the windows
it looks through past keys that hold back due rows.

A lease takes the due heads (:mod:`amqp_lab.outbox.sql`) - ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, under SQLite's write lock there - and their keys' next ready rows as chains,
writing ``lease_owner`` / ``lease_until`` and counting ``tries``; or, for keys the relay is
publishing already, their next rows (a continuation). Every statement is fenced by the lease:
a row another relay holds is never taken. :class:`~amqp_lab.outbox.store.OutboxStore` adds
the outcomes, renewals and purges.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from amqp_lab.dedup.arrays import array_literal
from amqp_lab.dedup.base import HandlerDb
from amqp_lab.outbox.admin import OutboxAdmin
from amqp_lab.outbox.chains import Candidate, cut, plan
from amqp_lab.outbox.db import number
from amqp_lab.outbox.lease import Lease, leased_row
from amqp_lab.outbox.rounds import LEASE_ROUNDS, rounds
from amqp_lab.outbox.sql import (
    STATEMENT_CLOCK,
    after_sql,
    blocked_sql,
    bound,
    followers_sql,
    heads_sql,
    in_list,
    key_order,
    lease_heads_sql,
    lease_sql,
    leased_rows_sql,
)

__all__ = ["LEASE_ROUNDS", "LeaseQueries"]


class LeaseQueries(OutboxAdmin):
    """The lease statements of :class:`~amqp_lab.outbox.store.OutboxStore` (its arguments and
    errors)."""

    def lease(
        self,
        owner: str,
        lease_seconds: float,
        max_rows: int,
        max_bytes: int,
        exclude: Sequence[int] = (),
        held: Sequence[str] = (),
        reach: int | None = None,
    ) -> Lease:
        """Lease a batch for ``owner``: the oldest due heads (:mod:`amqp_lab.outbox.sql`) and
        their keys' next ready rows as chains, at most ``max_rows`` rows and ``max_bytes``
        bytes (at least one row), none of ``exclude`` and no key of ``held`` (the relay's rows
        and keys in flight). An empty Lease when nothing is due.

        ``reach`` (PostgreSQL; SQLite ignores it): look for heads among at most that many of
        the oldest due rows, in one window - a lease taken ahead
        (:class:`~amqp_lab.outbox.leaser.LeaseRequest`), which may miss heads further on
        that the relay's next lease finds; without it a lease reads past every row of a key
        in ``held``, the whole backlog when every key is held."""

        def work(db: HandlerDb) -> Lease:
            args = (owner, lease_seconds, max_rows, max_bytes, exclude, held, reach)
            if self.relay_session:  # PostgreSQL: the lease's statement reads the clock
                return self._lease_postgres(db, None, *args)
            now = self._now(db, relaxed=True, lease=True)
            if self.dialect == "postgresql":
                return self._lease_postgres(db, now, *args)
            lease = Lease(db_now=now, local_now=time.time())
            skip_ids = list(exclude)

            def take(keys: list[str], skip: list[str], limit: int) -> list[Candidate]:
                found = self._heads(db, now, max_rows, limit, skip_ids, skip, keys)
                skip_ids.extend(h.id for h in found)
                return found

            def blocked(skip: list[str]) -> tuple[list[str], list[str]]:
                return self._blocked(db, now, 2 * max_rows, skip_ids, skip)

            heads, lease.blocked, lease.more_behind = rounds(
                take, blocked, lambda h: h.key, max_rows, held
            )
            if not heads:
                return lease
            followers = self._followers(db, now, heads, max_rows, exclude)
            chains = plan(heads, followers, max_rows, max_bytes)
            return self._lease_chains(db, lease, owner, lease_seconds, chains)

        return self._run("lease rows of", work)

    def lease_after(
        self,
        owner: str,
        lease_seconds: float,
        after: dict[str, int],
        max_rows: int,
        max_bytes: int,
    ) -> Lease:
        """Lease the next rows of keys ``owner`` holds - after the row id ``after`` gives for
        each - as one chain per key, up to each key's first row not ready, at most
        ``max_rows`` rows and ``max_bytes`` bytes (at least one row). While the key's earlier
        rows are leased they are no heads, so no other relay can take them; once those are
        recorded meanwhile (a lease run ahead), the first is a head, and the lease's own
        fence (unleased or expired rows only) keeps a row to one relay. They are to go once
        the key's earlier rows are confirmed (:meth:`amqp_lab.outbox.flight.Flight.start`
        defers them)."""

        def work(db: HandlerDb) -> Lease:
            now = self._now(db, relaxed=True, lease=True)
            lease = Lease(db_now=now, local_now=time.time())
            keys = sorted(after)
            per_key = 1 + max(1, max_rows // max(1, len(keys)))
            if self.dialect == "postgresql":
                ids = [after[k] for k in keys]
                params: tuple[Any, ...] = (array_literal(keys), array_literal(ids), per_key)
                found = db.execute(after_sql(self.dialect), params).fetchall()
            else:
                found = []
                for key in keys:
                    rows = db.execute(after_sql(self.dialect), (bound(key), after[key], per_key))
                    found.extend(rows.fetchall())
            by_key: dict[str, list[Any]] = {}
            for r in found:
                by_key.setdefault(r[1], []).append(r)  # as stored: equal to the key asked for

            def ready(r: Any) -> bool:
                return number(r[3]) <= now and (r[4] is None or number(r[4]) <= now)

            heads: list[Candidate] = []
            followers: list[Candidate] = []
            for key in keys:
                rows = by_key.get(key, [])
                if rows and ready(rows[0]):  # else the key's next row holds the rest
                    heads.append(Candidate(int(rows[0][0]), key, int(number(rows[0][2]))))
                    followers += [
                        Candidate(int(r[0]), key, int(number(r[2])), ready(r)) for r in rows[1:]
                    ]
            chains = plan(heads, followers, max_rows, max_bytes) if heads else []
            return self._lease_chains(db, lease, owner, lease_seconds, chains)

        return self._run("lease rows of", work)

    def _lease_chains(
        self,
        db: HandlerDb,
        lease: Lease,
        owner: str,
        lease_seconds: float,
        chains: list[list[int]],
    ) -> Lease:
        """Lease every row of ``chains`` still pending and unleased, and keep each chain up
        to its first row the lease did not get (the rest released untried)."""
        ids = [row_id for chain in chains for row_id in chain]
        if not ids:
            return lease
        now = lease.db_now
        sql, params = lease_sql(self.dialect, ids)
        returned = db.execute(sql, (owner, now + lease_seconds, *params, now)).fetchall()
        lease.rows = {row.id: row for row in map(leased_row, returned)}
        lease.chains, released = cut(chains, set(lease.rows))
        if released:
            self._release(db, owner, released, untried=True)
            for row_id in released:
                lease.rows.pop(row_id, None)
        return lease

    def _lease_postgres(
        self,
        db: HandlerDb,
        now: float | None,
        owner: str,
        lease_seconds: float,
        max_rows: int,
        max_bytes: int,
        exclude: Sequence[int],
        held: Sequence[str],
        reach: int | None = None,
    ) -> Lease:
        """PostgreSQL's lease: the heads leased in one statement that returns their columns
        (:func:`~amqp_lab.outbox.sql.lease_heads_sql`: a head's body only within the batch's
        share of the byte budget), then their keys' next rows when the batch has room (by
        :func:`~amqp_lab.outbox.sql.lease_sql`); heads beyond the byte budget are released
        untried, larger ones kept are read whole. ``now``: the database's clock read before,
        or None: the heads' statement reads it (a relay's session; an empty Lease then has
        ``db_now`` 0)."""
        scan = max_rows + max_rows // 2
        share = max(1, max_bytes // max(1, max_rows))
        local = time.time()
        clock: list[float] = [] if now is None else [now]

        def take(keys: list[str], skip: list[str], limit: int) -> list[Any]:
            heads = self._lease_heads(db, clock, owner, lease_seconds, exclude, skip, keys, reach)
            found = heads(scan, limit, share)
            if found and not clock:
                clock.append(number(found[0][-1]))
            return found

        def blocked_of(skip: list[str]) -> tuple[list[str], list[str]]:
            return self._blocked(db, clock[0] if clock else None, scan, exclude, skip)

        if reach is None:
            returned, blocked, more = rounds(take, blocked_of, lambda r: r[2], max_rows, held)
        else:  # one bounded window, no rounds past the keys holding rows back
            returned, blocked, more = take([], list(held), max_rows), [], False
        now = clock[0] if clock else None
        if now is None:  # nothing leased
            return Lease(local_now=local, blocked=blocked, more_behind=more)
        lease = Lease(db_now=now, local_now=local, blocked=blocked, more_behind=more)
        until = now + lease_seconds
        # LEASED_COLUMNS, then size and available_at: oldest first
        leased = sorted(returned, key=lambda r: (number(r[14]), int(r[0])))
        heads = [Candidate(int(r[0]), r[2], int(number(r[13]))) for r in leased]
        if not heads:
            return lease
        columns = {int(r[0]): r for r in leased}
        followers = self._followers(db, now, heads, max_rows, exclude)
        chains = plan(heads, followers, max_rows, max_bytes)
        return self._keep(db, lease, owner, until, heads, columns, chains, share)

    def _keep(
        self,
        db: HandlerDb,
        lease: Lease,
        owner: str,
        until: float,
        heads: list[Candidate],
        columns: dict[int, Any],
        chains: list[list[int]],
        share: int,
    ) -> Lease:
        """PostgreSQL: lease the chains' rows after their heads, release the heads the
        batch does not keep, read the kept heads larger than ``share``, and fill ``lease``."""
        now = lease.db_now
        kept = {row_id for chain in chains for row_id in chain}
        got = set(kept) & {h.id for h in heads}
        more = [row_id for row_id in kept if row_id not in got]
        if more:
            sql, params = lease_sql(self.dialect, more)
            returned = db.execute(sql, (owner, until, *params, now)).fetchall()
            columns.update((int(r[0]), r) for r in returned)
            got |= {int(r[0]) for r in returned}
        lease.chains, released = cut(chains, got)
        released += [h.id for h in heads if h.id not in kept]
        if released:
            self._release(db, owner, released, untried=True)
        keep = [row_id for chain in lease.chains for row_id in chain]
        kept_now = set(keep)
        large = [h.id for h in heads if h.size > share and h.id in kept_now]
        if large:  # kept heads whose headers and body the lease did not return
            sql, params = leased_rows_sql(large)
            columns.update((int(r[0]), r) for r in db.execute(sql, (*params, owner)).fetchall())
        lease.rows = {row_id: leased_row(columns[row_id]) for row_id in keep}
        return lease

    def _lease_heads(
        self,
        db: HandlerDb,
        clock: list[float],
        owner: str,
        lease_seconds: float,
        exclude: Sequence[int],
        skip: list[str],
        keys: list[str],
        reach: int | None = None,
    ) -> Callable[[int, int, int], list[Any]]:
        """One statement of :func:`~amqp_lab.outbox.sql.lease_heads_sql` - of ``keys``' heads
        or of the window without the keys in ``skip``, reading at most ``reach`` due rows
        when given - as a call of ``(scan, limit, share)``; the clock is ``clock``'s one
        value, or the statement's own."""
        at = clock[0] if clock else None
        bounded = reach is not None and not keys
        sql, lists = lease_heads_sql(
            exclude, skip, STATEMENT_CLOCK if at is None else "?", keys, bounded
        )
        bound = (reach,) if bounded else ()

        def run(scan: int, limit: int, share: int) -> list[Any]:
            if at is None:  # ([reach], lists, [scan], limit, owner, seconds, share, share)
                window = () if keys else (scan,)
                params = (*bound, *lists, *window, limit, owner, lease_seconds, share, share)
            else:  # (keys, now | now, [reach], now, lists, scan), now, limit, owner, until, ...
                heads = (*lists, at) if keys else (at, *bound, at, *lists, scan)
                params = (*heads, at, limit, owner, at + lease_seconds, at, share, share)
            found: list[Any] = db.execute(sql, params).fetchall()
            return found

        return run

    def _followers(
        self,
        db: HandlerDb,
        now: float,
        heads: list[Candidate],
        max_rows: int,
        exclude: Sequence[int],
    ) -> list[Candidate]:
        """The heads' keys' next pending rows, when the batch has room for them."""
        keys = sorted({h.key for h in heads if h.key is not None})
        if not keys or len(heads) >= max_rows:
            return []
        per_key = 1 + max(1, max_rows // len(heads))
        sql, params = followers_sql(self.dialect, keys)
        skip = set(exclude)
        found = []
        for r in db.execute(sql, (*params, per_key)).fetchall():
            ready = number(r[3]) <= now and (r[4] is None or number(r[4]) <= now)
            found.append(Candidate(int(r[0]), r[1], int(number(r[2])), ready and r[0] not in skip))
        return found

    def _heads(
        self,
        db: HandlerDb,
        now: float,
        max_rows: int,
        limit: int,
        exclude: Sequence[int],
        held: Sequence[str],
        keys: Sequence[str] = (),
    ) -> list[Candidate]:
        """SQLite: at most ``limit`` due heads, oldest first, in a window of ``2 *
        max_rows`` - or among the heads of ``keys`` (:func:`~amqp_lab.outbox.sql.heads_sql`)."""
        sql, params = heads_sql(self.dialect, exclude, held, keys=keys)
        if keys:
            params = (*params, now, now, limit)
        else:
            params = (now, now, *params, 2 * max_rows, now, limit)
        rows = db.execute(sql, params).fetchall()
        return [
            Candidate(int(r[0]), r[1] if isinstance(r[1], str) else None, int(number(r[2])))
            for r in rows
        ]

    def _blocked(
        self,
        db: HandlerDb,
        now: float | None,
        scan: int,
        exclude: Sequence[int],
        held: Sequence[str],
    ) -> tuple[list[str], list[str]]:
        """The keys holding back rows of the lease's window of ``scan`` rows, and those of
        them whose head can be leased now (:func:`~amqp_lab.outbox.sql.blocked_sql`);
        ``now`` None: the statement's clock."""
        if now is None:
            sql, params = blocked_sql(self.dialect, exclude, held, STATEMENT_CLOCK)
            params = (*params, scan, scan)
        else:
            sql, params = blocked_sql(self.dialect, exclude, held)
            params = (now, now, *params, scan, scan, now, now)
        # each key as stored (bound again as it is: a key's str() - of a SQLite key that is
        # not UTF-8, or by hand not text - matched none of its rows, and the lease skipping
        # it found the same window every round)
        found = [(r[0], bool(r[1])) for r in db.execute(sql, params).fetchall()]
        rows = sorted(found, key=lambda r: key_order(r[0]))
        return [key for key, _ in rows], [key for key, ready in rows if ready]

    def _release(self, db: HandlerDb, owner: str, ids: Sequence[int], untried: bool) -> None:
        chosen, params = in_list(self.dialect, "id", ids)
        tries = ", tries = CASE WHEN tries > 0 THEN tries - 1 ELSE 0 END" if untried else ""
        db.execute(
            f"UPDATE amqp_lab_outbox SET lease_owner = NULL, lease_until = NULL{tries}"
            f" WHERE {chosen} AND lease_owner = ?",
            (*params, owner),
        )
