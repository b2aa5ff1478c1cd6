"""What a person reads of a DLQ message (pure), whatever sits in the DLQ: :func:`view_of`
reads a record of :mod:`amqp_lab.dlq.record` (format 2 or 1) or a raw message the broker
dead-lettered itself (``x-death``) into one :class:`DlqEntry`, and never raises - a message
that is not a well-formed record is shown raw, one that cannot be read even so is shown as
``unreadable`` with the reason. :func:`replay_message` rebuilds the original message from an
entry: the same body bytes, headers of the same types and bytes, the same properties, to the
original exchange and routing key. Only amqp-lab's bookkeeping headers start afresh
(``attempts`` 0; no first_seen_at / original_exchange / original_routing_key) and the broker's
x-death family is dropped. :mod:`amqp_lab.dlq.summary` chooses and counts entries.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from amqp_lab.dlq.raw_record import RAW_RECORD_HEADER, raw_record_parts
from amqp_lab.dlq.record import RECORD_TYPE, decode_payload, encode_payload, utc_iso
from amqp_lab.message import (
    ATTEMPTS_HEADER,
    FIRST_SEEN_HEADER,
    JSON,
    REPLAYED_PROPERTIES,
    OutgoingMessage,
    decode_json,
    original_destination,
    user_headers,
)
from amqp_lab.typed_fields import from_typed, table_from_typed, typed_table

__all__ = ["DlqEntry", "replay_message", "view_of"]


@dataclass(frozen=True)
class DlqEntry:
    """One DLQ message as a person reads it, whichever way it got there. ``headers`` and
    ``properties`` hold real values (the types the message carried)."""

    message_id: str | None
    source: str  # "record", "x-death", "raw" or "unreadable" (see view_of)
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
    headers: dict[Any, Any]
    properties: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None
    queue: str | None = None  # the queue it failed in (the record's, or x-death's latest)
    x_death: list[Any] | None = None  # the broker's x-death array, where it had one

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe, lossless: headers and properties in the typed encoding."""
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
            "headers": typed_table(self.headers),
            "properties": typed_table(self.properties),
            "traceback": self.traceback,
        }


def view_of(body: bytes, properties: Any) -> DlqEntry:
    """Read a DLQ message (a record, or a raw message with x-death) into a :class:`DlqEntry`.
    ``properties``: the delivery's basic properties (attributes as pika's BasicProperties,
    decoded by :mod:`amqp_lab.wire`'s lossless codec). Never raises, whatever a publisher put
    in the DLQ: a message typed ``dlq-record`` whose body is not a well-formed record (not
    standard JSON - NaN and Infinity are refused -, a field of the wrong type, a payload that
    does not decode) is shown raw, as the broker holds it; a message that cannot be read even
    so (a bug, or input nobody foresaw) is shown as source ``unreadable`` with the reason as
    its error message."""
    try:
        if getattr(properties, "type", None) == RECORD_TYPE:
            try:
                return _view_of_record(_record_of(body, properties))
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                pass  # a damaged record is shown raw below rather than hidden
        return _view_of_raw(body, properties)
    except Exception as e:  # whatever a hostile message manages: never the reader's end
        return _unreadable(body, properties, e)


def _record_of(body: bytes, properties: Any) -> dict[str, Any]:
    """The record's fields: the JSON body, or - in the raw form (format 3,
    :mod:`amqp_lab.dlq.raw_record`) - the metadata header with the body as its payload."""
    headers = getattr(properties, "headers", None)
    if isinstance(headers, dict) and RAW_RECORD_HEADER in headers:
        meta, payload, encoding = raw_record_parts(body, headers)
        return meta | {"payload": payload, "payload_encoding": encoding}
    record = decode_json(body)
    if not isinstance(record, dict):
        raise _NotARecord(f"a record is a JSON object, not a {type(record).__name__}")
    return record


class _NotARecord(ValueError):
    """A field of a ``dlq-record`` body that is missing or of the wrong type."""


def _field(record: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """``record[name]``, ``default`` when absent; _NotARecord when it is not a ``kind``."""
    value = record.get(name, default)
    if value is not default and (isinstance(value, bool) or not isinstance(value, kind)):
        raise _NotARecord(f"record field {name!r} is a {type(value).__name__}")
    return value


def _short_text(record: dict[str, Any], name: str) -> str | None:
    """A field that is an AMQP short string in the message (message_id, exchange, routing
    key): text of at most 255 bytes in UTF-8, or None when absent."""
    value: str | None = _field(record, name, str, None)
    if value is not None and len(value.encode("utf-8", "surrogatepass")) > 255:
        raise _NotARecord(f"record field {name!r} is longer than an AMQP short string")
    return value


def _lone_surrogate(value: Any) -> bool:
    """Whether a parsed JSON value holds a lone surrogate in a string or a key (JSON escapes
    such as ``\\ud800`` parse into one), without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _shown(text: str) -> str:
    """``text`` with a lone surrogate written as ``\\udcNN``: an error message may hold one
    (``surrogateescape``), and a page or a UTF-8 log line cannot."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _view_of_record(record: Any) -> DlqEntry:
    if not isinstance(record, dict):
        raise _NotARecord("a record is a JSON object")
    error = _field(record, "error", dict, None)
    original = _field(record, "original", dict, None)
    if error is None or original is None:
        raise _NotARecord("a record names its error and its original destination")
    # Only an error's own text may hold a lone surrogate (build_record keeps an exception's
    # message as it is); anywhere else one means the record is not one amqp-lab wrote.
    texts = ("message", "traceback")
    if _lone_surrogate({**record, "error": {k: v for k, v in error.items() if k not in texts}}):
        raise _NotARecord("a record field holds a lone surrogate")
    if _field(record, "format", int, 1) >= 2:
        headers = table_from_typed(_field(record, "headers", list, None) or [])
        props = table_from_typed(_field(record, "properties", list, None) or [])
    else:  # format 1: headers as plain JSON values, properties not kept
        headers = dict(_field(record, "headers", dict, None) or {})
        props = {"content_type": _field(record, "content_type", str, None)}
    payload = record.get("payload")
    encoding = _field(record, "payload_encoding", str, "json")
    decode_payload(payload, encoding)  # a payload that cannot be replayed is no record
    exchange = _short_text(original, "exchange")
    routing_key = _short_text(original, "routing_key")
    if exchange is None or routing_key is None:
        raise _NotARecord("a record names its original exchange and routing key")
    error_type = _field(error, "type", str, None)
    if error_type is None:
        raise _NotARecord("a record names its error's type")
    deaths = record.get("x_death")
    return DlqEntry(
        message_id=_short_text(record, "message_id"),
        source="record",
        error_type=error_type,
        error_message=_shown(_field(error, "message", str, "")),
        classification=_field(record, "classification", str, "?"),
        attempts=_field(record, "attempts", int, 0),
        first_seen_at=_field(record, "first_seen_at", str, None),
        last_failed_at=_field(record, "last_failed_at", str, None),
        exchange=exchange,
        routing_key=routing_key,
        payload=payload,
        payload_encoding=encoding,
        headers=headers,
        properties=props,
        traceback=_shown(_field(error, "traceback", str, "")) or None,
        queue=_field(original, "queue", str, None) or None,
        x_death=_deaths(from_typed(deaths)) if deaths else None,
    )


def _view_of_raw(body: bytes, properties: Any) -> DlqEntry:
    raw_headers = getattr(properties, "headers", None)
    headers = dict(raw_headers) if isinstance(raw_headers, dict) else {}
    # x-death as the broker writes it: an array of tables, the latest death first. Anything
    # else a publisher put there (RabbitMQ keeps a publisher's x-death) reads as no death.
    deaths = headers.get("x-death")
    deaths = deaths if isinstance(deaths, list) else []
    first = deaths[0] if deaths and isinstance(deaths[0], dict) else {}
    payload, encoding = encode_payload(bytes(body))
    reason = _text(first.get("reason", "")) or "unknown"
    keys = first.get("routing-keys")
    exchange, routing_key = original_destination(
        headers,
        _text(first.get("exchange", "")),
        _text(keys[0]) if isinstance(keys, list) and keys else "",
    )
    attempts_header = headers.get(ATTEMPTS_HEADER)
    message_id = getattr(properties, "message_id", None)
    return DlqEntry(
        message_id=message_id if isinstance(message_id, str) else None,
        source="x-death" if deaths else "raw",
        error_type=f"dead-lettered:{reason}",
        error_message=f"{reason} from queue {_text(first.get('queue', '?'))}" if deaths else "",
        classification="rejected" if deaths else "?",
        # x-death's count is how often the broker dead-lettered it, not how often it was tried;
        # our header counts only republished retries. Unknown unless the header says more.
        attempts=(
            int(attempts_header)
            if isinstance(attempts_header, int)
            and not isinstance(attempts_header, bool)
            and attempts_header > 0
            else None
        ),
        first_seen_at=_time(headers.get(FIRST_SEEN_HEADER)),
        last_failed_at=_time(first.get("time")),
        exchange=exchange,
        routing_key=routing_key,
        payload=payload,
        payload_encoding=encoding,
        headers=headers,
        properties={
            name: getattr(properties, name, None)
            for name in REPLAYED_PROPERTIES
            if getattr(properties, name, None) is not None
        },
        queue=_text(first["queue"]) if "queue" in first else None,
        x_death=_deaths(deaths),
    )


def _unreadable(body: Any, properties: Any, error: BaseException) -> DlqEntry:
    """The entry for a message that :func:`view_of` could not read: the exact body as base64,
    the reason as the error, nothing else trusted. A replay of it fails (no message_id)."""
    try:
        raw = bytes(body)
    except Exception:
        raw = b""
    return DlqEntry(
        message_id=None,
        source="unreadable",
        error_type="unreadable",
        error_message=f"cannot read this DLQ message: {type(error).__name__}: {error}"[:2000],
        classification="?",
        attempts=None,
        first_seen_at=None,
        last_failed_at=None,
        exchange="",
        routing_key="",
        payload=base64.b64encode(raw).decode("ascii"),
        payload_encoding="base64",
        headers={},
    )


def _deaths(value: Any) -> list[Any] | None:
    return list(value) if isinstance(value, list) and value else None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _time(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return utc_iso(value.replace(tzinfo=value.tzinfo or UTC).timestamp())
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return utc_iso(float(value))
        except (OverflowError, OSError, ValueError):
            return str(value)
    return _text(value)


def replay_message(entry: DlqEntry, exchange: str | None = None) -> OutgoingMessage:
    """The original message to republish: the exact body, the same message_id, the publisher's
    headers with their types and bytes, the properties of :data:`REPLAYED_PROPERTIES`, to the
    original exchange and routing key (``exchange`` overrides the exchange). ``attempts``
    restarts at 0; amqp-lab's other bookkeeping headers and the broker's x-death family are
    dropped."""
    headers = user_headers(entry.headers)
    headers[ATTEMPTS_HEADER] = 0
    props = {k: v for k, v in entry.properties.items() if k in REPLAYED_PROPERTIES}
    content_type = props.pop("content_type", None)
    if content_type is None and entry.source == "record" and entry.payload_encoding == "json":
        content_type = JSON
    return OutgoingMessage(
        body=decode_payload(entry.payload, entry.payload_encoding),
        message_id=entry.message_id or "",
        exchange=entry.exchange if exchange is None else exchange,
        routing_key=entry.routing_key,
        content_type=content_type,
        headers=headers,
        **props,
    )
