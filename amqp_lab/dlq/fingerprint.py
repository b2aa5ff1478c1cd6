"""DLQ fingerprints (pure): which dead-lettered records failed the same way.

A record's fingerprint is its error type, its error message **normalised** - the parts that
differ from one message to the next (numbers, hex ids, UUIDs, times, quoted strings, e-mail
addresses, the record's own message_id) replaced by placeholders, so ``order 42 failed`` and
``order 43 failed`` are one problem - and, when the record carries a traceback, its **top
frame**: the file and function where the exception was raised (no line number, so a deploy
that moves the line does not split a group). :func:`group` gathers DLQ entries by
fingerprint; the console (docs/console.md) shows one row per group and acts on a group.

The fingerprint's id is a short hash of those three parts: stable across processes and
versions of Python, and safe in a URL.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from amqp_lab.dlq.summary import parse_time
from amqp_lab.dlq.view import DlqEntry

__all__ = [
    "FINGERPRINT_CHARS",
    "Fingerprint",
    "Group",
    "fingerprint_of",
    "group",
    "normalise_message",
    "selects",
    "top_frame",
]

FINGERPRINT_CHARS = 12
"""Hex digits of a fingerprint id (48 bits: a collision among a DLQ's groups is negligible)."""

_MIN_ID_CHARS = 4  # a shorter message_id ("7") would replace digits inside unrelated words

# Order matters: the specific shapes first, so a UUID is not seen as five numbers.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?<![\w'\"])'[^'\n]*'(?![\w'])"), "<str>"),
    (re.compile(r"(?<![\w'\"])\"[^\"\n]*\"(?![\w\"])"), "<str>"),
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), "<email>"),
    (
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
        "<uuid>",
    ),
    (
        re.compile(r"\b\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)?"),
        "<time>",
    ),
    # a number in exponent form first: "1.0000000000000002e+16" holds a hex-looking run
    (re.compile(r"[-+]?\d+(?:\.\d+)?e[-+]\d+|[-+]?\d+\.\d+e\d+", re.I), "<n>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<hex>"),
    # a hex id: 8+ hex digits with at least one letter and one digit (a plain number is <n>)
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.I), "<hex>"),
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", re.I), "<n>"),
)
_SPACES = re.compile(r"\s+")
# "  File "/app/handlers.py", line 12, in handle" - also inside an exception group's "| " margin
_FRAME = re.compile(r'^[\s|+]*File "(?P<file>[^"\n]*)", line \d+, in (?P<function>[^\n]+)$', re.M)
_INSTALLED = re.compile(r"^.*/(?:site|dist)-packages/")


def normalise_message(message: str, message_id: str | None = None) -> str:
    """``message`` with what varies between occurrences of one problem replaced by
    placeholders: the record's own ``message_id`` (``<message_id>``, when it has at least 4
    characters), quoted strings (``<str>``), e-mail addresses, UUIDs, ISO times, hex ids
    (``0x1f``, ``9b2e4f1a``: ``<hex>``) and numbers (``<n>``, signs and decimals included);
    runs of whitespace become one space."""
    text = message
    if message_id and len(message_id) >= _MIN_ID_CHARS:
        text = text.replace(message_id, "<message_id>")
    for pattern, placeholder in _PATTERNS:
        text = pattern.sub(placeholder, text)
    return _SPACES.sub(" ", text).strip()


def top_frame(traceback: str | None) -> str | None:
    """``file in function`` of the frame where the exception was raised - the last frame of a
    formatted traceback (with chained exceptions: of the one raised last) - without its line
    number, and with only the file's last two path parts (``package/module.py``), so the same
    bug raised by workers in different checkouts or release directories
    (``/srv/releases/41/app/orders.py``, ``/srv/releases/42/app/orders.py``) is one group.
    None when there is no traceback or no frame in it."""
    if not traceback:
        return None
    frames = list(_FRAME.finditer(traceback))
    if not frames:
        return None
    last = frames[-1]
    path = "/".join(_INSTALLED.sub("", last.group("file")).replace("\\", "/").split("/")[-2:])
    return f"{path} in {last.group('function').strip()}"


@dataclass(frozen=True)
class Fingerprint:
    """What makes two records the same problem; ``id`` is its short stable hash."""

    error_type: str
    message: str  # normalised
    top_frame: str | None

    @property
    def id(self) -> str:
        """:data:`FINGERPRINT_CHARS` hex digits of SHA-256 over the three parts."""
        text = "\n".join((self.error_type, self.message, self.top_frame or ""))
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        return digest[:FINGERPRINT_CHARS]


def fingerprint_of(entry: DlqEntry) -> Fingerprint:
    """The fingerprint of one DLQ entry (a record or a message the broker dead-lettered)."""
    return Fingerprint(
        error_type=entry.error_type,
        message=normalise_message(entry.error_message, entry.message_id),
        top_frame=top_frame(entry.traceback),
    )


@dataclass(frozen=True)
class Group:
    """The DLQ entries of one fingerprint, in DLQ order. ``first_seen`` / ``last_seen``: the
    earliest ``first_seen_at`` and the latest ``last_failed_at`` of its entries (ISO 8601 as
    the records write them; None when no entry has one); ``queues``: the queues its messages
    failed in, sorted."""

    fingerprint: Fingerprint
    entries: tuple[DlqEntry, ...]
    first_seen: str | None
    last_seen: str | None
    queues: tuple[str, ...]

    @property
    def id(self) -> str:
        """The fingerprint's id (for URLs)."""
        return self.fingerprint.id

    @property
    def count(self) -> int:
        """How many entries the group holds."""
        return len(self.entries)

    @property
    def error_type(self) -> str:
        return self.fingerprint.error_type

    @property
    def message(self) -> str:
        """The normalised error message."""
        return self.fingerprint.message

    @property
    def top_frame(self) -> str | None:
        return self.fingerprint.top_frame


def group(entries: Iterable[DlqEntry]) -> list[Group]:
    """Gather ``entries`` by fingerprint: the largest group first, then the one seen last;
    the entries of a group keep their DLQ order."""
    members: dict[Fingerprint, list[DlqEntry]] = {}
    for entry in entries:
        members.setdefault(fingerprint_of(entry), []).append(entry)
    groups = [_group_of(fp, items) for fp, items in members.items()]
    groups.sort(key=lambda g: g.id)
    groups.sort(key=lambda g: _sortable(g.last_seen), reverse=True)
    groups.sort(key=lambda g: g.count, reverse=True)
    return groups


def _group_of(fingerprint: Fingerprint, entries: list[DlqEntry]) -> Group:
    firsts = [_timed(e.first_seen_at or e.last_failed_at) for e in entries]
    lasts = [_timed(e.last_failed_at or e.first_seen_at) for e in entries]
    first = min((t for t in firsts if t is not None), default=None)
    last = max((t for t in lasts if t is not None), default=None)
    return Group(
        fingerprint=fingerprint,
        entries=tuple(entries),
        first_seen=first[1] if first else None,
        last_seen=last[1] if last else None,
        queues=tuple(sorted({e.queue for e in entries if e.queue})),
    )


def _timed(value: str | None) -> tuple[datetime, str] | None:
    """(parsed, as written) for a time that parses as an aware ISO 8601 time, else None."""
    try:
        parsed = parse_time(value)
    except (ValueError, TypeError):
        return None
    if parsed is None or parsed.tzinfo is None:
        return None
    return parsed, str(value)


def _sortable(value: str | None) -> float:
    timed = _timed(value)
    return timed[0].timestamp() if timed else float("-inf")


def selects(
    fingerprint: str, message_ids: Collection[str] | None = None
) -> Callable[[DlqEntry], bool]:
    """A select function for :func:`amqp_lab.dlq.ops.replay` / ``delete``: the entries whose
    fingerprint id is ``fingerprint`` and, when ``message_ids`` is given, whose message_id is
    one of them - so a record that failed again differently between a dry run and its
    confirmation (same message_id, other fingerprint) is left alone."""
    wanted = None if message_ids is None else frozenset(message_ids)

    def select(entry: DlqEntry) -> bool:
        if wanted is not None and entry.message_id not in wanted:
            return False
        return fingerprint_of(entry).id == fingerprint

    return select
