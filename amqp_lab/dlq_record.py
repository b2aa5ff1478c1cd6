"""DLQ records (pure): what a person needs to find the cause of a dead-lettered message.

Two kinds of message can sit in the DLQ:

* a **record** published by the consumer (``type = "dlq-record"``, the default): a JSON body with
  payload, error, attempts, first_seen_at, last_failed_at, message_id, the original exchange and
  routing key, and the classification;
* a **raw** message moved by the broker's DLX after basic.reject(requeue=False): its original
  body with an ``x-death`` header (https://www.rabbitmq.com/docs/dlx#effects).

:func:`view_of` reads both into one :class:`DlqEntry`, and :func:`replay_message` rebuilds the
original message from either.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from amqp_lab.message import (
    ATTEMPTS_HEADER,
    FIRST_SEEN_HEADER,
    JSON,
    OutgoingMessage,
    encode_json,
)

RECORD_TYPE = "dlq-record"
_BROKER_HEADER_PREFIXES = ("x-death", "x-first-death-", "x-last-death-")


def utc_iso(ts: float) -> str:
    """ISO 8601 UTC with milliseconds, e.g. ``2026-11-29T17:41:02.123Z``; ``ts`` in seconds."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


MAX_PAYLOAD_DEPTH = 100
"""JSON nested deeper than this is kept as text in a record: the record itself, browsing it and
replaying it parse the payload again, one level deeper and at other stack depths, where
Python's recursion limit (about 1000) would turn a poison body into a crash."""


def encode_payload(body: bytes) -> tuple[Any, str]:
    """(payload, encoding): the parsed JSON value ("json") when it nests at most
    ``MAX_PAYLOAD_DEPTH`` levels, else the text ("text"), else base64. Never raises."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(body).decode("ascii"), "base64"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # "[" * 5000 exhausts the recursion limit
        return text, "text"
    if json_depth(value) > MAX_PAYLOAD_DEPTH:
        return text, "text"
    return value, "json"


def json_depth(value: Any) -> int:
    """How many arrays/objects nest in a parsed JSON value (0 for a scalar), without
    recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in item)
    return deepest


def decode_payload(payload: Any, encoding: str) -> bytes:
    """Inverse of :func:`encode_payload` (JSON re-encoded compactly)."""
    if encoding == "base64":
        return base64.b64decode(payload)
    if encoding == "text":
        return str(payload).encode("utf-8")
    return encode_json(payload)


def build_record(
    *,
    body: bytes,
    message_id: str | None,
    exchange: str,
    routing_key: str,
    queue: str,
    content_type: str | None,
    headers: dict[str, Any] | None,
    error: BaseException,
    classification: str,
    attempts: int,
    first_seen_at: str,
    failed_at: float,
) -> dict[str, Any]:
    """The DLQ record body for a failed delivery. ``failed_at`` in seconds since the epoch."""
    payload, encoding = encode_payload(body)
    return {
        "message_id": message_id,
        "payload": payload,
        "payload_encoding": encoding,
        "content_type": content_type,
        "error": {"type": type(error).__name__, "message": str(error)[:2000]},
        # "transient" covers unknown exceptions too: they get the transient retry treatment
        # (the error type tells a bug from an outage).
        "classification": classification,
        "attempts": attempts,
        "first_seen_at": first_seen_at,
        "last_failed_at": utc_iso(failed_at),
        "original": {"exchange": exchange, "routing_key": routing_key, "queue": queue},
        "headers": _plain_headers(headers),
    }


def _plain_headers(headers: dict[str, Any] | None) -> dict[str, Any]:
    """Headers minus the broker's x-death family, made JSON-safe."""
    result: dict[str, Any] = {}
    for key, value in (headers or {}).items():
        if key.startswith(_BROKER_HEADER_PREFIXES):
            continue
        result[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return result


def record_message(record: dict[str, Any], dlx: str, routing_key: str) -> OutgoingMessage:
    """The message carrying ``record`` to the DLX: persistent, same message_id, type dlq-record."""
    return OutgoingMessage(
        body=encode_json(record),
        message_id=record.get("message_id") or "",
        exchange=dlx,
        routing_key=routing_key,
        content_type=JSON,
        headers={ATTEMPTS_HEADER: record["attempts"]},
        type=RECORD_TYPE,
    )


@dataclass(frozen=True)
class DlqEntry:
    """One DLQ message as a person reads it, whichever way it got there."""

    message_id: str | None
    source: str  # "record" or "x-death"
    error_type: str
    error_message: str
    classification: str
    attempts: int | None  # None: unknown (moved by the broker's DLX, not by our record)
    first_seen_at: str | None
    last_failed_at: str | None
    exchange: str
    routing_key: str
    payload: Any
    payload_encoding: str
    headers: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "source": self.source,
            "error": {"type": self.error_type, "message": self.error_message},
            "classification": self.classification,
            "attempts": self.attempts,
            "first_seen_at": self.first_seen_at,
            "last_failed_at": self.last_failed_at,
            "original": {"exchange": self.exchange, "routing_key": self.routing_key},
            "payload": self.payload,
            "payload_encoding": self.payload_encoding,
            "headers": self.headers,
        }


def view_of(
    body: bytes, message_id: str | None, msg_type: str | None, headers: dict[str, Any] | None
) -> DlqEntry:
    """Read a DLQ message (a record, or a raw message with x-death) into a :class:`DlqEntry`."""
    if msg_type == RECORD_TYPE:
        try:
            record = json.loads(body)
            return DlqEntry(
                message_id=record.get("message_id"),
                source="record",
                error_type=record["error"]["type"],
                error_message=record["error"]["message"],
                classification=record.get("classification", "?"),
                attempts=int(record.get("attempts", 0)),
                first_seen_at=record.get("first_seen_at"),
                last_failed_at=record.get("last_failed_at"),
                exchange=record["original"]["exchange"],
                routing_key=record["original"]["routing_key"],
                payload=record.get("payload"),
                payload_encoding=record.get("payload_encoding", "json"),
                headers=record.get("headers") or {},
            )
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            pass  # a damaged record is shown raw below rather than hidden
    headers = headers or {}
    deaths = headers.get("x-death") or []
    first = deaths[0] if deaths else {}
    payload, encoding = encode_payload(body)
    reason = _text(first.get("reason", "")) or "unknown"
    exchanges = first.get("exchange")
    keys = first.get("routing-keys") or [""]
    attempts_header = headers.get(ATTEMPTS_HEADER)
    return DlqEntry(
        message_id=message_id,
        source="x-death" if deaths else "raw",
        error_type=f"dead-lettered:{reason}",
        error_message=f"{reason} from queue {_text(first.get('queue', '?'))}" if deaths else "",
        classification="rejected" if deaths else "?",
        # x-death's count is how often the broker dead-lettered it, not how often it was tried;
        # our header counts only republished retries. Unknown unless the header says more.
        attempts=attempts_header if isinstance(attempts_header, int) and attempts_header else None,
        first_seen_at=_time(headers.get(FIRST_SEEN_HEADER)),
        last_failed_at=_time(first.get("time")),
        exchange=_text(exchanges) if exchanges is not None else "",
        routing_key=_text(keys[0]),
        payload=payload,
        payload_encoding=encoding,
        headers=_plain_headers(headers),
    )


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _time(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return utc_iso(value.replace(tzinfo=value.tzinfo or UTC).timestamp())
    if isinstance(value, int | float):
        return utc_iso(float(value))
    return _text(value)


def replay_message(entry: DlqEntry, exchange: str | None = None) -> OutgoingMessage:
    """The original message to republish: original payload, same message_id, ``attempts`` reset
    to 0, x-death and x-first-death-*/x-last-death-* removed. ``exchange`` overrides the
    recorded one (an empty recorded exchange falls back to ``tasks``)."""
    headers = {
        k: v
        for k, v in entry.headers.items()
        if not k.startswith(_BROKER_HEADER_PREFIXES) and k != FIRST_SEEN_HEADER
    }
    headers[ATTEMPTS_HEADER] = 0
    return OutgoingMessage(
        body=decode_payload(entry.payload, entry.payload_encoding),
        message_id=entry.message_id or "",
        exchange=exchange or entry.exchange or "tasks",
        routing_key=entry.routing_key,
        content_type=JSON if entry.payload_encoding == "json" else "application/octet-stream",
        headers=headers,
    )


def parse_time(value: str | None) -> datetime | None:
    """Parse our ISO 8601 timestamps (``...Z`` or with an offset); None stays None."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class DlqSummary:
    """``depth`` records; ``oldest_age`` seconds since the oldest ``last_failed_at`` (None when
    no record carries a time); ``by_error_type`` counts, most frequent first."""

    depth: int
    oldest_age: float | None
    by_error_type: tuple[tuple[str, int], ...]


def summarize(entries: list[DlqEntry], now: datetime) -> DlqSummary:
    """Summarize DLQ entries as of ``now`` (an aware datetime)."""
    times = [t for t in (parse_time(e.last_failed_at) for e in entries) if t is not None]
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

    def matches(self, entry: DlqEntry) -> bool:
        if self.message_id is not None and entry.message_id != self.message_id:
            return False
        if self.error_type is not None and entry.error_type != self.error_type:
            return False
        if self.since is not None or self.until is not None:
            failed = parse_time(entry.last_failed_at)
            if failed is None:
                return False
            if self.since is not None and failed < self.since:
                return False
            if self.until is not None and failed > self.until:
                return False
        return True
