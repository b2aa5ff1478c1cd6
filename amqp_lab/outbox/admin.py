"""What an operator and the metrics read and change in an outbox: its status, the relays'
heartbeats, the rows the broker refused (list, retry, discard).
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Sequence
from typing import Any

from amqp_lab.dedup.base import HandlerDb
from amqp_lab.errors import OutboxError
from amqp_lab.outbox.db import OutboxDb, number
from amqp_lab.outbox.row import UndecodableText
from amqp_lab.outbox.sql import bound, in_list, mark, status_sql
from amqp_lab.outbox.status import FailedRow, OutboxStatus, RelaySeen
from amqp_lab.outbox.write import encodable

__all__ = ["RELAY_SEEN_WITHIN", "OutboxAdmin"]

RELAY_SEEN_WITHIN = 60.0
"""Seconds: a relay whose heartbeat is more recent is counted as running."""


class OutboxAdmin(OutboxDb):
    """An outbox's status and operations (see :class:`~amqp_lab.outbox.db.OutboxDb` for the
    arguments and the errors)."""

    def status(self) -> OutboxStatus:
        """The outbox now (:class:`~amqp_lab.outbox.status.OutboxStatus`)."""

        def work(db: HandlerDb) -> tuple[OutboxStatus, float | None]:
            now = self._now(db)
            row = db.execute(status_sql(self.dialect), (now, now, now, now)).fetchone()
            heartbeats = db.execute(
                "SELECT relay_id, host, pid, started_at, seen_at FROM amqp_lab_outbox_relays"
                " WHERE seen_at >= ? ORDER BY started_at",
                (now - RELAY_SEEN_WITHIN,),
            ).fetchall()
            relays = tuple(seen for r in heartbeats if (seen := _relay_seen(r, now)) is not None)
            oldest = None if row[5] is None else max(0.0, now - number(row[5], now))
            status = OutboxStatus(
                now, int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]), oldest, relays
            )
            return status, None if row[6] is None else number(row[6], now)

        status, self.next_wake = self._run("read the status of", work)
        return status

    next_wake: float | None = None
    """After :meth:`status`: the earliest future time a pending row becomes due (or None)."""

    def next_due(self, exclude: Sequence[int] = ()) -> float | None:
        """Seconds until the earliest pending row not yet due becomes due - a scheduled row,
        or a refused one's next try - among rows not in ``exclude`` (None: none is ahead).
        Parked rows never become due."""

        def work(db: HandlerDb) -> float | None:
            now = self._now(db)
            kept, params = in_list(self.dialect, "id", exclude, negate=True)
            row = db.execute(
                "SELECT min(available_at) FROM amqp_lab_outbox WHERE sent_at IS NULL"
                f" AND available_at > ? AND available_at < 1e300 AND {kept}",
                (now, *params),
            ).fetchone()
            return None if row[0] is None else max(0.0, number(row[0], now) - now)

        return self._run("read the next due time of", work)

    def heartbeat(self, relay_id: str, started_at: float) -> None:
        """Record that relay ``relay_id`` (this host and process) is running; forget relays
        not heard from for a day."""

        def work(db: HandlerDb) -> None:
            now = self._now(db)
            db.execute(
                "INSERT INTO amqp_lab_outbox_relays (relay_id, host, pid, started_at, seen_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (relay_id) DO UPDATE SET"
                " seen_at = excluded.seen_at",
                (relay_id, socket.gethostname(), os.getpid(), started_at, now),
            )
            db.execute("DELETE FROM amqp_lab_outbox_relays WHERE seen_at < ?", (now - 86400,))

        self._run("write a heartbeat to", work)

    def forget_relay(self, relay_id: str) -> None:
        """Remove relay ``relay_id``'s heartbeat (a clean stop)."""
        self._run(
            "remove a heartbeat from",
            lambda db: db.execute(
                "DELETE FROM amqp_lab_outbox_relays WHERE relay_id = ?", (relay_id,)
            ),
        )

    def failed(self, limit: int = 100) -> list[FailedRow]:
        """The first ``limit`` pending rows whose last publish was refused, oldest first."""

        def work(db: HandlerDb) -> list[FailedRow]:
            rows = db.execute(
                "SELECT message_id, ordering_key, exchange, routing_key, tries, last_error,"
                " refused_at, available_at FROM amqp_lab_outbox WHERE sent_at IS NULL"
                " AND last_error IS NOT NULL ORDER BY id LIMIT ?",
                (limit,),
            ).fetchall()
            return [_failed_row(r) for r in rows]

        return self._run("list refused rows of", work)

    def retry(self, message_id: str | None) -> int:
        """Make refused rows (one, or all with None) due now - parked ones included - unless a
        relay holds them; how many."""

        def work(db: HandlerDb) -> int:
            now = self._now(db)
            which, given = ("", ()) if message_id is None else self._refused_id(db, message_id)
            return int(
                db.execute(
                    "UPDATE amqp_lab_outbox SET available_at = ? WHERE sent_at IS NULL"
                    " AND last_error IS NOT NULL AND (lease_until IS NULL OR lease_until <= ?)"
                    + which,
                    (now, now, *given),
                ).rowcount
            )

        return self._run("retry refused rows of", work)

    def discard(self, message_id: str) -> FailedRow | None:
        """Delete the refused row ``message_id`` (it will never be published; its key's later
        rows go on) unless a relay holds it; the row, or None when there is no such refused
        row."""

        def work(db: HandlerDb) -> FailedRow | None:
            now = self._now(db)
            which, given = self._refused_id(db, message_id)
            row = db.execute(
                "DELETE FROM amqp_lab_outbox WHERE sent_at IS NULL"
                " AND last_error IS NOT NULL AND (lease_until IS NULL OR lease_until <= ?)"
                + which
                + " RETURNING message_id, ordering_key, exchange, routing_key, tries, last_error,"
                " refused_at, available_at",
                (now, *given),
            ).fetchone()
            return None if row is None else _failed_row(row)

        return self._run("discard a row of", work)

    def _refused_id(self, db: HandlerDb, message_id: str) -> tuple[str, tuple[Any, ...]]:
        """The condition naming ``message_id`` and its parameter. A SQLite message_id that is
        not UTF-8 is matched by its stored bytes when ``message_id`` is the text the status
        shows for it (before, retry and discard bound that text, which matched no row: such a
        row could only be retried with ``--all``, never discarded). Raises OutboxError when
        several rows show as that text."""
        if not encodable(message_id):  # bytes that are not UTF-8, as a shell passes them on
            if db.dialect == "postgresql":
                return " AND 1 = 0", ()  # no PostgreSQL text holds them
            raw = message_id.encode("utf-8", "surrogateescape")
            return " AND message_id = CAST(? AS TEXT)", (raw,)
        shown = _shown_as(db, message_id)
        exact = (
            bool(shown)
            and db.execute(
                "SELECT 1 FROM amqp_lab_outbox WHERE message_id = ? AND sent_at IS NULL"
                " AND last_error IS NOT NULL",
                (message_id,),
            ).fetchone()
            is not None
        )
        if len(shown) + exact > 1:
            raise OutboxError(
                f"{len(shown) + exact} refused rows show as message_id {message_id!r} (bytes"
                " that are not UTF-8): name the one you mean by its bytes, retry them all with"
                " --all, or delete them by hand"
            )
        if shown:
            return f" AND message_id = {mark(shown[0])}", (bound(shown[0]),)
        return " AND message_id = ?", (message_id,)


def _shown_as(db: HandlerDb, message_id: str) -> list[UndecodableText]:
    """SQLite: the refused rows' message_ids that are not UTF-8 and show as ``message_id``
    (U+FFFD in place of their bad bytes, as :meth:`OutboxAdmin.failed` lists them)."""
    if db.dialect != "sqlite" or "\ufffd" not in message_id:
        return []
    rows = db.execute(
        "SELECT DISTINCT message_id FROM amqp_lab_outbox WHERE sent_at IS NULL"
        " AND last_error IS NOT NULL"
    ).fetchall()
    return [r[0] for r in rows if isinstance(r[0], UndecodableText) and str(r[0]) == message_id]


def _relay_seen(r: Sequence[Any], now: float) -> RelaySeen | None:
    """A heartbeat row as a live relay, or None: one whose ``seen_at`` is not a time within
    :data:`RELAY_SEEN_WITHIN` of ``now`` (a hostile row's text or NaN - SQLite compares text
    above every number, PostgreSQL NaN above every float - or a time ahead, left by a relay that
    died before the clock went back) counts as no relay, whatever else it holds. Before, such
    a row counted as a live relay for ever, and a pid that was no number failed the status."""
    seen = number(r[4], math.nan)
    if not abs(seen - now) <= RELAY_SEEN_WITHIN:
        return None
    return RelaySeen(str(r[0]), str(r[1]), int(number(r[2])), number(r[3]), seen)


def _failed_row(r: Sequence[Any]) -> FailedRow:
    retry_at = number(r[7], math.inf)
    return FailedRow(
        str(r[0]),
        r[1] if isinstance(r[1], str) else None,
        str(r[2]),
        str(r[3]),
        int(number(r[4])),
        str(r[5]),
        None if r[6] is None else number(r[6]),
        None if not math.isfinite(retry_at) or retry_at > 1e300 else retry_at,
    )
