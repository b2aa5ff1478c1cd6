"""Choosing and counting DLQ entries (pure): the times an entry carries
(:func:`parse_time`, :func:`time_of`), :func:`summarize` (depth, oldest age, counts by error
type) and :class:`Selection` (what ``amqp-lab-replay`` and the console select).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from amqp_lab.dlq.view import DlqEntry

__all__ = ["DlqSummary", "Selection", "parse_time", "summarize", "time_of"]


def parse_time(value: str | None) -> datetime | None:
    """Parse our ISO 8601 timestamps (``...Z`` or with an offset); None stays None. Raises
    ValueError for text that is not ISO 8601 (see :func:`time_of`, which never raises)."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def time_of(value: str | None) -> datetime | None:
    """An entry's time (``last_failed_at``, ``first_seen_at``) as an aware datetime, or None
    when it is absent or unreadable - a raw message's header holds whatever its publisher
    wrote. A time without a zone is UTC, as the broker's x-death times are."""
    try:
        when = parse_time(value)
    except (ValueError, TypeError, AttributeError):
        return None
    return when if when is None or when.tzinfo else when.replace(tzinfo=UTC)


@dataclass(frozen=True)
class DlqSummary:
    """``depth`` records; ``oldest_age`` seconds since the oldest ``last_failed_at`` (None when
    no record carries a time); ``by_error_type`` counts, most frequent first."""

    depth: int
    oldest_age: float | None
    by_error_type: tuple[tuple[str, int], ...]


def summarize(entries: list[DlqEntry], now: datetime) -> DlqSummary:
    """Summarize DLQ entries as of ``now`` (an aware datetime)."""
    times = [t for t in (time_of(e.last_failed_at) for e in entries) if t is not None]
    oldest = (now - min(times)).total_seconds() if times else None
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.error_type] = counts.get(entry.error_type, 0) + 1
    ranked = tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return DlqSummary(len(entries), oldest, ranked)


@dataclass(frozen=True)
class Selection:
    """Which DLQ entries to replay: all given criteria must match. ``since`` / ``until`` bound
    ``last_failed_at`` (inclusive); ``limit`` is applied by the caller, in DLQ order."""

    message_id: str | None = None
    error_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    key: str | None = None  # the ordered topology's entity key (the ``key`` header)

    def matches(self, entry: DlqEntry) -> bool:
        if self.message_id is not None and entry.message_id != self.message_id:
            return False
        if self.key is not None and entry.headers.get("key") != self.key:
            return False
        if self.error_type is not None and entry.error_type != self.error_type:
            return False
        if self.since is not None or self.until is not None:
            failed = time_of(entry.last_failed_at)
            if failed is None:
                return False
            if self.since is not None and failed < self.since:
                return False
            if self.until is not None and failed > self.until:
                return False
        return True
