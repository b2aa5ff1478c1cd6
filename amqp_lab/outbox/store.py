"""The relay's side of one outbox database: leases, outcomes, purges, status (psycopg 3 or
sqlite3, one connection, used from one thread).

A relay leases a batch in one short transaction - the heads ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, under SQLite's write lock there - writing ``lease_owner`` / ``lease_until`` and
counting ``tries``; publishes outside any transaction; then records every row's outcome in
another (:meth:`OutboxStore.complete`), each statement fenced by ``lease_owner = me``: a
relay whose lease ran out and was taken over changes nothing. A lease lives
``lease_seconds`` on the database's clock (renewed while the batch is in flight): a relay
that dies leaves its rows to be leased again once it expires (on SQLite at once: the next
relay to hold the lock file knows the last one is gone, :meth:`OutboxStore.reset_leases`).

Every method raises OutboxUnavailable when the database cannot be reached (it reconnects on
the next call) and OutboxError for any other failure, with the password masked.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from amqp_lab.dedup.arrays import array_literal
from amqp_lab.dedup.base import HandlerDb
from amqp_lab.outbox.admin import OutboxAdmin
from amqp_lab.outbox.chains import Candidate, cut, plan
from amqp_lab.outbox.db import number
from amqp_lab.outbox.lease import Lease, leased_row
from amqp_lab.outbox.outcomes import PARKED, RowResult, Verdict
from amqp_lab.outbox.sql import (
    after_sql,
    followers_sql,
    heads_sql,
    in_list,
    lease_heads_sql,
    lease_sql,
    leased_rows_sql,
)

__all__ = ["Lease", "OutboxStore", "open_outbox"]  # Lease: amqp_lab.outbox.lease


class OutboxStore(OutboxAdmin):
    """The relay's side of the outbox in the database ``url_or_path`` names (the arguments and
    errors of :class:`~amqp_lab.outbox.db.OutboxDb`): leases, outcomes, purges, plus the
    status and operations of :class:`~amqp_lab.outbox.admin.OutboxAdmin`."""

    def lease(
        self,
        owner: str,
        lease_seconds: float,
        max_rows: int,
        max_bytes: int,
        exclude: Sequence[int] = (),
        held: Sequence[str] = (),
    ) -> Lease:
        """Lease a batch for ``owner``: the oldest due heads (:mod:`amqp_lab.outbox.sql`) and
        their keys' next ready rows as chains, at most ``max_rows`` rows and ``max_bytes``
        bytes (at least one row), none of ``exclude`` and no key of ``held`` (the relay's rows
        and keys in flight). An empty Lease when nothing is due."""

        def work(db: HandlerDb) -> Lease:
            now = self._now(db, relaxed=True, lease=True)
            lease = Lease(db_now=now, local_now=time.time())
            if self.dialect == "postgresql":
                return self._lease_postgres(
                    db, lease, owner, lease_seconds, max_rows, max_bytes, exclude, held
                )
            heads = self._heads(db, now, max_rows, exclude, held)
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
        ``max_rows`` rows and ``max_bytes`` bytes (at least one row). They are no heads, so no
        other relay can take them; they are to go once the key's earlier rows are confirmed
        (:meth:`amqp_lab.outbox.flight.Flight.start` defers them)."""

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
                    rows = db.execute(after_sql(self.dialect), (key, after[key], per_key))
                    found.extend(rows.fetchall())
            by_key: dict[str, list[Any]] = {}
            for r in found:
                by_key.setdefault(str(r[1]), []).append(r)

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
        lease: Lease,
        owner: str,
        lease_seconds: float,
        max_rows: int,
        max_bytes: int,
        exclude: Sequence[int],
        held: Sequence[str],
    ) -> Lease:
        """PostgreSQL's lease: the heads leased in one statement that returns their columns
        (:func:`~amqp_lab.outbox.sql.lease_heads_sql`: a head's body only within the batch's
        share of the byte budget), then their keys' next rows when the batch has room (by
        :func:`~amqp_lab.outbox.sql.lease_sql`); heads beyond the byte budget are released
        untried, larger ones kept are read whole."""
        now, until = lease.db_now, lease.db_now + lease_seconds
        sql, params = lease_heads_sql(exclude, held)
        scan = max_rows + max_rows // 2
        share = max(1, max_bytes // max(1, max_rows))
        rows = db.execute(
            sql, (owner, until, now, now, *params, scan, now, max_rows, now, share, share)
        )
        # LEASED_COLUMNS, then size and available_at: oldest first
        leased = sorted(rows.fetchall(), key=lambda r: (number(r[14]), int(r[0])))
        heads = [Candidate(int(r[0]), r[2], int(number(r[13]))) for r in leased]
        if not heads:
            return lease
        columns = {int(r[0]): r for r in leased}
        followers = self._followers(db, now, heads, max_rows, exclude)
        chains = plan(heads, followers, max_rows, max_bytes)
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
        exclude: Sequence[int],
        held: Sequence[str],
    ) -> list[Candidate]:
        """The due heads, oldest first (:func:`~amqp_lab.outbox.sql.heads_sql`), locked on
        PostgreSQL."""
        sql, params = heads_sql(self.dialect, exclude, held)
        rows = db.execute(sql, (now, now, *params, 2 * max_rows, now, max_rows)).fetchall()
        return [
            Candidate(int(r[0]), r[1] if isinstance(r[1], str) else None, int(number(r[2])))
            for r in rows
        ]

    def _release(self, db: HandlerDb, owner: str, ids: Sequence[int], untried: bool) -> None:
        chosen, params = in_list(self.dialect, "id", ids)
        tries = ", tries = CASE WHEN tries > 0 THEN tries - 1 ELSE 0 END" if untried else ""
        db.execute(
            f"UPDATE amqp_lab_outbox SET lease_owner = NULL, lease_until = NULL{tries}"
            f" WHERE {chosen} AND lease_owner = ?",
            (*params, owner),
        )

    def renew(self, owner: str, ids: Sequence[int], lease_seconds: float) -> int:
        """Extend ``owner``'s lease on ``ids`` (still its own) by ``lease_seconds`` from now;
        how many it still held."""

        def work(db: HandlerDb) -> int:
            now = self._now(db, relaxed=True)
            chosen, params = in_list(self.dialect, "id", ids)
            return int(
                db.execute(
                    f"UPDATE amqp_lab_outbox SET lease_until = ? WHERE {chosen}"
                    " AND lease_owner = ?",
                    (now + lease_seconds, *params, owner),
                ).rowcount
            )

        return self._run("renew leases in", work) if ids else 0

    def complete(self, owner: str, results: Sequence[RowResult], keep_sent: bool) -> None:
        """Record each leased row's outcome (:mod:`amqp_lab.outbox.outcomes`) in one
        transaction: sent rows deleted (or kept with ``sent_at`` when ``keep_sent``), refused
        ones with their error and next try (parked: never by themselves), lost ones released
        after a short wait, unattempted ones released untried. Only rows ``owner`` still
        leases change: the call is idempotent."""

        by: dict[Verdict, list[RowResult]] = {verdict: [] for verdict in Verdict}
        for result in results:  # one pass: a batch is up to batch_rows results
            by[result.verdict].append(result)

        def work(db: HandlerDb) -> None:
            now = self._now(db, relaxed=True)
            sent = [r.row_id for r in by[Verdict.SENT]]
            if sent:
                chosen, params = in_list(self.dialect, "id", sent)
                if keep_sent:
                    db.execute(
                        "UPDATE amqp_lab_outbox SET sent_at = ?, lease_owner = NULL,"
                        f" lease_until = NULL, last_error = NULL WHERE {chosen}"
                        " AND lease_owner = ?",
                        (now, *params, owner),
                    )
                else:
                    db.execute(
                        f"DELETE FROM amqp_lab_outbox WHERE {chosen} AND lease_owner = ?",
                        (*params, owner),
                    )
            refused = by[Verdict.REFUSED]
            if refused:
                db.executemany(
                    "UPDATE amqp_lab_outbox SET last_error = ?, refused_at = ?, available_at = ?,"
                    " lease_owner = NULL, lease_until = NULL WHERE id = ? AND lease_owner = ?",
                    [
                        (
                            r.error or "refused",
                            now,
                            PARKED if r.parked else now + r.wait,
                            r.row_id,
                            owner,
                        )
                        for r in refused
                    ],
                )
            for lost in by[Verdict.LOST][:1]:
                ids = [r.row_id for r in by[Verdict.LOST]]
                chosen, params = in_list(self.dialect, "id", ids)
                db.execute(
                    "UPDATE amqp_lab_outbox SET lease_owner = NULL, lease_until = NULL,"
                    f" available_at = ? WHERE {chosen} AND lease_owner = ?",
                    (now + lost.wait, *params, owner),
                )
            untried = [r.row_id for r in by[Verdict.UNATTEMPTED]]
            if untried:
                self._release(db, owner, untried, untried=True)

        if results:
            self._run("record publish outcomes in", work)

    def release_all(self, owner: str, keep: Sequence[int] = ()) -> int:
        """Release every lease ``owner`` holds but ``keep`` (a relay stopping, or cleaning up
        after a lease whose commit's answer was lost); tries stay counted. How many."""

        def work(db: HandlerDb) -> int:
            kept, params = in_list(self.dialect, "id", keep, negate=True)
            return int(
                db.execute(
                    "UPDATE amqp_lab_outbox SET lease_owner = NULL, lease_until = NULL"
                    f" WHERE lease_owner = ? AND {kept}",
                    (owner, *params),
                ).rowcount
            )

        return self._run("release leases in", work)

    def reset_leases(self) -> int:
        """Release every lease (SQLite: the previous holder of the relay lock is gone). How
        many."""
        return self._run(
            "reset leases in",
            lambda db: int(
                db.execute(
                    "UPDATE amqp_lab_outbox SET lease_owner = NULL, lease_until = NULL"
                    " WHERE lease_owner IS NOT NULL"
                ).rowcount
            ),
        )

    def purge_sent(self, older_than: float, limit: int = 5000) -> int:
        """Delete at most ``limit`` rows sent before ``older_than`` (epoch seconds, the
        database's clock); how many."""

        def work(db: HandlerDb) -> int:
            return int(
                db.execute(
                    "DELETE FROM amqp_lab_outbox WHERE id IN (SELECT id FROM amqp_lab_outbox"
                    " WHERE sent_at IS NOT NULL AND sent_at < ? ORDER BY sent_at LIMIT ?)",
                    (older_than, limit),
                ).rowcount
            )

        return self._run("purge sent rows of", work)


def open_outbox(url_or_path: str | Path, **options: Any) -> OutboxStore:
    """:class:`OutboxStore` for ``url_or_path`` (``options``: its keyword arguments). Raises
    ConfigurationError for an unknown scheme, OutboxError / OutboxUnavailable when it cannot be
    opened."""
    return OutboxStore(url_or_path, **options)
