"""The raw form of a DLQ record (pure): for a message whose JSON record would not fit.

A JSON record (:func:`amqp_lab.dlq.record.build_record`) carries the body as JSON, text or
base64 - at most 4/3 of the body plus a bounded rest - and a body may be as large as the
broker's ``max_message_size`` (16 MiB by default on RabbitMQ 4.x, 128 MiB on 3.x;
https://www.rabbitmq.com/docs/configure#config-items). A message the broker accepted must
always be dead-lettered, so when the JSON record is over that size the record is sent in its
**raw form** instead (record format 3):

* the body is the message's own bytes, unchanged: never larger than what the broker accepted
  (``max_message_size`` limits the body only, not the header frame; checked on 3.10.8 and
  4.3.6);
* the publisher's headers travel as headers again, in their wire types (the lossless codec);
* the rest of the record - error, classification, attempts, times, the original exchange,
  routing key and queue, every property in the typed encoding, x-death - is JSON in one
  header, :data:`RAW_RECORD_HEADER`; the message's ``type`` is ``dlq-record`` as for every
  record, and its ``attempts`` header the record's.

The header frame must stay within one frame (``MAX_PROPERTIES_BYTES``): the original's fitted,
and the record's metadata is made smaller step by step (no traceback, a shorter error, no
x-death detail) until it fits. :func:`raw_record_message` returns None when even the smallest
does not - a message whose own headers fill the frame - and the consumer then leaves the
message where it is (docs/failure-model.md). :func:`raw_record_view` reads it back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from amqp_lab.dlq.record import RECORD_TYPE, encode_payload, encode_record
from amqp_lab.errors import UnencodableMessage
from amqp_lab.message import ATTEMPTS_HEADER, OutgoingMessage, user_headers
from amqp_lab.typed_fields import table_from_typed, typed_table

__all__ = ["RAW_RECORD_FORMAT", "RAW_RECORD_HEADER", "raw_record_message", "raw_record_parts"]

RAW_RECORD_HEADER = "amqp_lab_dlq_record"
RAW_RECORD_FORMAT = 3
_NATIVE_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "priority",
    "app_id",
    "timestamp",
)
"""Properties the raw form keeps as properties (all of them are in the metadata too). Not
kept natively: ``expiration`` (the record would expire), ``user_id`` (the broker refuses one
that is not the publishing user), ``type`` (it says ``dlq-record``), ``delivery_mode`` (a
record is persistent)."""


def raw_record_message(
    record: dict[str, Any],
    *,
    body: bytes,
    headers: dict[Any, Any] | None,
    properties: dict[str, Any],
    dlx: str,
    routing_key: str,
) -> OutgoingMessage | None:
    """The raw form of ``record`` (a JSON record's fields, :func:`build_record`): ``body``
    as it is, the publisher's ``headers`` natively, the rest as JSON in
    :data:`RAW_RECORD_HEADER`; ``properties`` the delivery's by name. None when its header
    frame cannot fit one frame even with the smallest metadata."""
    native = user_headers(headers)
    meta = {k: v for k, v in record.items() if k not in ("payload", "payload_encoding", "headers")}
    meta["format"] = RAW_RECORD_FORMAT
    if RAW_RECORD_HEADER in native:  # a publisher's header of that name: kept in the metadata
        meta["headers_shadowed"] = typed_table({RAW_RECORD_HEADER: native.pop(RAW_RECORD_HEADER)})
    kept = {name: properties[name] for name in _NATIVE_PROPERTIES if properties.get(name)}
    for variant in _smaller(meta):
        message = OutgoingMessage(
            body=body,
            message_id=record.get("message_id") or "",
            exchange=dlx,
            routing_key=routing_key,
            headers={
                **native,
                ATTEMPTS_HEADER: record["attempts"],
                RAW_RECORD_HEADER: encode_record(variant).decode("ascii"),
            },
            type=RECORD_TYPE,
            **({"content_type": None} | kept),
        )
        try:
            message.sealed_properties()
        except UnencodableMessage:
            continue  # too large for one frame (or unencodable): try a smaller variant
        return message
    return None


def _smaller(meta: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``meta``, then ever smaller versions of it: no traceback; a 200-character error; no
    x-death detail and no properties beyond the type (the original's lose nothing the message
    does not carry natively but for expiration, user_id and cluster_id)."""
    yield meta
    error = dict(meta.get("error") or {})
    error.pop("traceback", None)
    smaller = {**meta, "error": error}
    yield smaller
    error = {**error, "message": str(error.get("message", ""))[:200]}
    smaller = {**smaller, "error": error}
    yield smaller
    smaller = {k: v for k, v in smaller.items() if k not in ("x_death", "retry_error")}
    smaller["properties"] = [p for p in smaller.get("properties", []) if p[0] == "type"]
    smaller["trimmed"] = True
    yield smaller


def raw_record_parts(body: bytes, headers: dict[Any, Any]) -> tuple[dict[str, Any], Any, str]:
    """Read a raw-form record: (the record's fields with ``headers`` in the typed encoding
    again, payload, payload encoding) - what :func:`amqp_lab.dlq.record.view_of` reads from a
    JSON record. Raises ValueError, KeyError or TypeError when the metadata is not a record's
    (the caller shows the message raw then)."""
    text = headers[RAW_RECORD_HEADER]
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    meta = json.loads(text, parse_constant=_refuse_constant)
    if not isinstance(meta, dict) or meta.get("format") != RAW_RECORD_FORMAT:
        raise ValueError("not a raw-form record")
    native = {k: v for k, v in headers.items() if k not in (RAW_RECORD_HEADER, ATTEMPTS_HEADER)}
    native.update(table_from_typed(meta.pop("headers_shadowed", [])))
    meta["headers"] = typed_table(native)
    payload, encoding = encode_payload(body)
    return meta, payload, encoding


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")
