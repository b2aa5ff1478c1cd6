"""DLQ records (pure): what a person needs to find the cause of a dead-lettered message, and
everything needed to send it again exactly as it was.

Two kinds of message can sit in the DLQ:

* a **record** published by the consumer (``type = "dlq-record"``, the default): a JSON body
  (format 2, docs/dlq-record.md) with the exact body, every header and property in the typed
  encoding of :mod:`amqp_lab.fieldtable`, the error (with a bounded traceback for an
  unexpected exception), classification, attempts, first_seen_at, last_failed_at, and the
  message's **original** exchange and routing key, kept across every retry hop;
* a **raw** message moved by the broker's DLX after basic.reject(requeue=False): its original
  body and properties with an ``x-death`` header (https://www.rabbitmq.com/docs/dlx#effects).

:mod:`amqp_lab.dlq.view` reads both (and format 1 records) into one ``DlqEntry`` and
rebuilds the original message from it for a replay; this module writes records.
"""

from __future__ import annotations

import base64
import json
import traceback
from datetime import UTC, datetime
from typing import Any

from amqp_lab.errors import error_text
from amqp_lab.message import (
    ATTEMPTS_HEADER,
    JSON,
    OutgoingMessage,
    encode_json,
    original_destination,
    user_headers,
)
from amqp_lab.typed_fields import typed_table

__all__ = [
    "MAX_PAYLOAD_DEPTH",
    "MAX_TRACEBACK_CHARS",
    "RECORD_FORMAT",
    "RECORD_TYPE",
    "bounded_traceback",
    "build_record",
    "decode_payload",
    "encode_payload",
    "encode_record",
    "fallback_record",
    "json_depth",
    "record_message",
    "utc_iso",
]

RECORD_TYPE = "dlq-record"
RECORD_FORMAT = 2
MAX_TRACEBACK_CHARS = 8000
MAX_PAYLOAD_DEPTH = 100
"""JSON nested deeper than this is kept as text in a record: the record itself, browsing it and
replaying it parse the payload again, one level deeper and at other stack depths, where
Python's recursion limit (about 1000) would turn a poison body into a crash."""


def utc_iso(ts: float) -> str:
    """ISO 8601 UTC with milliseconds, e.g. ``2026-11-29T17:41:02.123Z``; ``ts`` in seconds."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode_payload(body: bytes) -> tuple[Any, str]:
    """(payload, encoding), lossless and small: the parsed JSON value ("json") only when
    re-encoding it gives back exactly ``body`` and it nests at most ``MAX_PAYLOAD_DEPTH``
    levels, else the UTF-8 text ("text"), else base64 - and base64 whenever the other would
    take more than three times the body's size in the record (an ASCII JSON string escapes a
    non-ASCII character of two to four UTF-8 bytes into six or twelve - at most three times -
    but a control character of one byte into six; base64 takes 4/3), so a payload never takes
    more than three times the body plus 2 bytes, and a body of control characters (``\x00``
    * n, once six times its size) goes as base64. Never raises."""
    limit = 3 * len(body) + 2
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return _base64(body)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # "[" * 5000 exhausts the recursion limit
        return (text, "text") if _record_size(text) <= limit else _base64(body)
    candidate: tuple[Any, str] = (text, "text")
    if json_depth(value) <= MAX_PAYLOAD_DEPTH:
        try:
            if encode_json(value) == body:
                candidate = (value, "json")
        except (ValueError, TypeError, RecursionError):
            pass
    return candidate if _record_size(candidate[0]) <= limit else _base64(body)


def _base64(body: bytes) -> tuple[str, str]:
    return base64.b64encode(body).decode("ascii"), "base64"


def _record_size(payload: Any) -> int:
    """Bytes ``payload`` takes in a record (compact ASCII JSON); a huge size when it cannot
    be encoded at all (a NaN, a lone surrogate, a depth past the recursion limit)."""
    try:
        return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=True, allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        return 1 << 62


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
    """Inverse of :func:`encode_payload`."""
    if encoding == "base64":
        return base64.b64decode(payload)
    if encoding == "text":
        return str(payload).encode("utf-8")
    return encode_json(payload)


def bounded_traceback(error: BaseException, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """The formatted traceback of ``error``, at most ``limit`` characters: the end is kept,
    where the exception was raised."""
    text = "".join(traceback.format_exception(error))
    return text if len(text) <= limit else "...\n" + text[-(limit - 4) :]


def build_record(
    *,
    body: bytes,
    message_id: str | None,
    exchange: str,
    routing_key: str,
    queue: str,
    properties: dict[str, Any],
    headers: dict[Any, Any] | None,
    error: BaseException,
    classification: str,
    attempts: int,
    first_seen_at: str,
    failed_at: float,
    undecodable_headers: bytes | None = None,
) -> dict[str, Any]:
    """The DLQ record body (format 2) for a failed delivery. ``exchange`` / ``routing_key``
    are the delivery's; the record names the original ones (:func:`original_destination`).
    ``properties``: the delivery's basic properties by name (None values left out);
    ``failed_at`` in seconds since the epoch; ``attempts``: deliveries tried, this one
    included - the record's own ``attempts`` header says the same. An ``unknown``
    classification (neither a business nor a transient error) carries a bounded traceback."""
    payload, encoding = encode_payload(body)
    content_type = properties.get("content_type")
    original_exchange, original_key = original_destination(headers, exchange, routing_key)
    error_info: dict[str, Any] = {"type": type(error).__name__, "message": error_text(error)}
    if classification == "unknown":
        error_info["traceback"] = bounded_traceback(error)
    record: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "message_id": message_id,
        "payload": payload,
        "payload_encoding": encoding,
        # a content_type that is not UTF-8 (a short string may be any bytes) is kept, exactly,
        # in the typed properties only: JSON has no bytes
        "content_type": content_type if isinstance(content_type, str) else None,
        "properties": typed_table({k: v for k, v in properties.items() if v is not None}),
        "headers": typed_table(user_headers(headers)),
        "error": error_info,
        "classification": classification,
        "attempts": attempts,
        "first_seen_at": first_seen_at,
        "last_failed_at": utc_iso(failed_at),
        "original": {"exchange": original_exchange, "routing_key": original_key, "queue": queue},
    }
    if headers and "x-death" in headers:
        record["x_death"] = typed_table({"x-death": headers["x-death"]})[0][1]
    if undecodable_headers is not None:
        record["headers_raw"] = base64.b64encode(undecodable_headers).decode("ascii")
    return record


def fallback_record(
    *, body: bytes, message_id: str | None, queue: str, error: BaseException, problem: str
) -> dict[str, Any]:
    """A minimal record for when :func:`build_record` itself failed (a bug, or input nobody
    foresaw): the exact body as base64, the error, and what went wrong building the record. The
    message still reaches the DLQ instead of crashing the worker on every redelivery."""
    return {
        "format": RECORD_FORMAT,
        "message_id": message_id,
        "payload": base64.b64encode(body).decode("ascii"),
        "payload_encoding": "base64",
        "error": {"type": type(error).__name__, "message": error_text(error)},
        "record_error": problem[:2000],
        "classification": "unknown",
        "attempts": 0,
        "original": {"exchange": "", "routing_key": "", "queue": queue},
    }


def encode_record(record: dict[str, Any]) -> bytes:
    """The record's JSON body: compact, sorted keys, ASCII - an exception message may hold a
    lone surrogate (``surrogateescape``, ``os.fsdecode``) that UTF-8 cannot encode; JSON
    escapes keep it - and standard (no NaN or Infinity: a float header that is one is in the
    typed encoding, as its IEEE bits). Never raises for a record built here."""
    return json.dumps(
        record, separators=(",", ":"), sort_keys=True, ensure_ascii=True, allow_nan=False
    ).encode()


def record_message(record: dict[str, Any], dlx: str, routing_key: str) -> OutgoingMessage:
    """The message carrying ``record`` to the DLX: persistent, same message_id, type dlq-record,
    and an ``attempts`` header equal to the record's."""
    return OutgoingMessage(
        body=encode_record(record),
        message_id=record.get("message_id") or "",
        exchange=dlx,
        routing_key=routing_key,
        content_type=JSON,
        headers={ATTEMPTS_HEADER: record["attempts"]},
        type=RECORD_TYPE,
    )
