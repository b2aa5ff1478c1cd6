"""The DLQ console's broker operations: a capped browse, and replay / delete of the records a
person confirmed, with the same library code and audit log as ``scripts/replay.py``.

A confirmed action selects by message_id **and** fingerprint (:func:`selects`): a record that
failed again differently since its dry run is left alone, and reported as missing. The
console's operations run one at a time (a lock): a browse holds the DLQ's first
``max_records`` messages while it reads them, and another operation in between would miss
them. A confirmed replay or delete of any size is one bounded pass
(:mod:`amqp_lab.dlq.window`): at most ``window`` messages unacked at once, each for at most
``max_hold`` seconds, the records of other groups moved to the DLQ's tail when it must get
past them; a dry run moves nothing and reads what a page load reads (``max_records``).
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from amqp_lab.dlq.audit_log import AuditLog
from amqp_lab.dlq.fingerprint import selects
from amqp_lab.dlq.ops import DeleteResult, ReplayResult, browse, delete, depth, replay
from amqp_lab.dlq.view import DlqEntry
from amqp_lab.dlq.window import DEFAULT_MAX_HOLD, DEFAULT_WINDOW, PassReport
from amqp_lab.errors import ConfigurationError
from amqp_lab.settings import BrokerSettings

__all__ = ["DlqActions", "Outcome", "Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """The DLQ's first ``len(entries)`` records (oldest first); ``depth``: how many it holds
    (known exactly when ``capped``, else ``len(entries)``)."""

    entries: tuple[DlqEntry, ...]
    depth: int
    capped: bool


@dataclass(frozen=True)
class Outcome:
    """What a replay or delete did (or, ``dry_run``, would do). ``missing``: message_ids
    confirmed but not found with their fingerprint (gone, or changed since the dry run);
    ``capped``: a dry run stopped at ``max_records`` (the rest of the group comes after);
    ``report``: what the pass over the DLQ did (records examined, moved, most held at once)."""

    action: str  # replay | delete
    dry_run: bool
    results: tuple[ReplayResult | DeleteResult, ...]
    missing: tuple[str, ...] = ()
    capped: bool = False
    report: PassReport | None = None

    def count(self, status: str) -> int:
        """How many results have ``status``."""
        return sum(r.status == status for r in self.results)


class DlqActions:
    """The console's operations on the DLQ ``queue``: :meth:`snapshot` reads at most
    ``max_records``; :meth:`replay` and :meth:`delete` append to the audit log at
    ``audit_log`` (opened for each confirmed action: ConfigurationError before anything is
    touched when it cannot be written) and hold at most ``window`` messages unacked for at
    most ``max_hold`` seconds. Broker errors are amqp_lab errors (NotFound for a missing DLQ,
    BrokerUnavailable, ReplayStopped...)."""

    def __init__(
        self,
        settings: BrokerSettings,
        queue: str,
        *,
        audit_log: Path,
        max_records: int,
        window: int = DEFAULT_WINDOW,
        max_hold: float = DEFAULT_MAX_HOLD,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.audit_log = audit_log
        self.max_records = max_records
        self.window = window
        self.max_hold = max_hold
        self._lock = threading.Lock()

    def snapshot(self) -> Snapshot:
        """basic.get up to ``max_records`` records without ack and requeue them (browse); the
        exact depth by passive queue.declare when that cap was reached."""
        with self._lock:
            entries = tuple(browse(self.settings, self.queue, self.max_records))
            capped = len(entries) >= self.max_records
            total = depth(self.settings, self.queue) if capped else len(entries)
        return Snapshot(entries, max(total, len(entries)), capped and total > len(entries))

    def replay(
        self,
        fingerprint: str,
        message_ids: Collection[str] | None,
        *,
        dry_run: bool,
        rate: float | None = None,
    ) -> Outcome:
        """Replay (:func:`amqp_lab.dlq.ops.replay`: confirmed republish, then basic.ack) the
        records of ``fingerprint`` - those with ``message_ids`` when given - at most ``rate``
        per second. A dry run lists at most ``max_records``, touches nothing and writes no
        audit line."""
        select = selects(fingerprint, message_ids)
        passes: list[PassReport] = []
        with self._lock:
            if dry_run:
                results = replay(
                    self.settings,
                    select,
                    queue=self.queue,
                    dry_run=True,
                    limit=self.max_records,
                    window=self.max_records,
                )
                return Outcome("replay", True, tuple(results), capped=self._capped(results))
            with self._audit() as log:

                def audit(result: ReplayResult) -> None:
                    log.write(result.entry, result.status, result.detail)

                results = replay(
                    self.settings,
                    select,
                    queue=self.queue,
                    rate=rate,
                    on_result=audit,
                    window=self.window,
                    max_hold=self.max_hold,
                    on_pass=passes.append,
                )
        missing = _missing(message_ids, results)
        return Outcome("replay", False, tuple(results), missing, report=passes[0])

    def delete(
        self, fingerprint: str, message_ids: Collection[str] | None, *, dry_run: bool
    ) -> Outcome:
        """Delete (:func:`amqp_lab.dlq.ops.delete`: basic.ack without republishing) the
        records of ``fingerprint`` - those with ``message_ids`` when given. Each deleted record
        gets an audit line with status ``deleted``; a dry run lists at most ``max_records``
        and touches nothing."""
        select = selects(fingerprint, message_ids)
        passes: list[PassReport] = []
        with self._lock:
            if dry_run:
                results = delete(
                    self.settings,
                    select,
                    queue=self.queue,
                    dry_run=True,
                    limit=self.max_records,
                    window=self.max_records,
                )
                return Outcome("delete", True, tuple(results), capped=self._capped(results))
            with self._audit() as log:

                def audit(result: DeleteResult) -> None:
                    log.write(result.entry, result.status, result.detail)

                results = delete(
                    self.settings,
                    select,
                    queue=self.queue,
                    on_result=audit,
                    window=self.window,
                    max_hold=self.max_hold,
                    on_pass=passes.append,
                )
        missing = _missing(message_ids, results)
        return Outcome("delete", False, tuple(results), missing, report=passes[0])

    def _capped(self, results: list[ReplayResult] | list[DeleteResult]) -> bool:
        return len(results) >= self.max_records

    def _audit(self) -> AuditLog:
        try:
            return AuditLog(self.audit_log, vhost=self.settings.vhost, queue=self.queue)
        except OSError as e:
            raise ConfigurationError(
                f"cannot append to the audit log {self.audit_log}: {e.strerror or e}"
            ) from e


def _missing(
    wanted: Collection[str] | None, results: list[ReplayResult] | list[DeleteResult]
) -> tuple[str, ...]:
    found = {r.entry.message_id for r in results}
    return tuple(sorted(set(wanted or ()) - found))
