"""The relay's side of one outbox database: leases, outcomes, purges, status (psycopg 3 or
sqlite3, one connection, used from one thread).

A relay leases a batch (:mod:`amqp_lab.outbox.leasing`) - the heads ``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, under SQLite's write lock there - writing ``lease_owner`` /
``lease_until`` and counting ``tries``; publishes outside any transaction; then records
every row's outcome in another (:meth:`OutboxStore.complete`), each statement fenced by
``lease_owner = me``: a relay whose lease ran out and was taken over changes nothing. A
lease lives
``lease_seconds`` on the database's clock (renewed while the batch is in flight): a relay
that dies leaves its rows to be leased again once it expires (on SQLite at once: the next
relay to hold the lock file knows the last one is gone, :meth:`OutboxStore.reset_leases`).

Every method raises OutboxUnavailable when the database cannot be reached (it reconnects on
the next call) and OutboxError for any other failure, with the password masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from amqp_lab.dedup.base import HandlerDb
from amqp_lab.outbox.lease import Lease
from amqp_lab.outbox.leasing import LEASE_ROUNDS, LeaseQueries
from amqp_lab.outbox.outcomes import PARKED, RowResult, Verdict
from amqp_lab.outbox.sql import in_list

__all__ = ["LEASE_ROUNDS", "Lease", "OutboxStore", "open_outbox"]  # from .lease, .leasing


class OutboxStore(LeaseQueries):
    """The relay's side of the outbox in the database ``url_or_path`` names (the arguments and
    errors of :class:`~amqp_lab.outbox.db.OutboxDb`): leases, outcomes, purges, plus the
    status and operations of :class:`~amqp_lab.outbox.admin.OutboxAdmin`."""

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
        transaction (a relay's session: statement by statement): sent rows deleted (or kept
        with ``sent_at`` when ``keep_sent``), refused ones with their error and next try
        (parked: never by themselves), lost ones released after a short wait, unattempted
        ones released untried. Only rows ``owner`` still leases change: the call is
        idempotent."""

        by: dict[Verdict, list[RowResult]] = {verdict: [] for verdict in Verdict}
        for result in results:  # one pass: a batch is up to batch_rows results
            by[result.verdict].append(result)

        # a relay's session reads the clock only when a statement needs it: a batch all sent
        # is one statement, one round trip
        timed = not self.relay_session or bool(
            (keep_sent and by[Verdict.SENT]) or by[Verdict.REFUSED] or by[Verdict.LOST]
        )

        def work(db: HandlerDb) -> None:
            now = self._now(db, relaxed=True) if timed else 0.0
            self._record_sent(db, owner, [r.row_id for r in by[Verdict.SENT]], keep_sent, now)
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

    def _record_sent(
        self, db: HandlerDb, owner: str, sent: list[int], keep_sent: bool, now: float
    ) -> None:
        """Sent rows: deleted, or kept with ``sent_at`` ``now`` (``keep_sent``)."""
        if not sent:
            return
        chosen, params = in_list(self.dialect, "id", sent)
        if keep_sent:
            db.execute(
                "UPDATE amqp_lab_outbox SET sent_at = ?, lease_owner = NULL,"
                f" lease_until = NULL, last_error = NULL WHERE {chosen} AND lease_owner = ?",
                (now, *params, owner),
            )
        else:
            db.execute(
                f"DELETE FROM amqp_lab_outbox WHERE {chosen} AND lease_owner = ?",
                (*params, owner),
            )

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
