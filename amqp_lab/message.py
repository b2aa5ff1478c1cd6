"""Messages as values: what the publisher sends and what a consumer decodes (pure, no I/O).

Every message amqp-lab publishes is persistent (delivery_mode 2), has a ``message_id`` and a
``timestamp`` (seconds since the epoch, AMQP's unit), and carries our own ``attempts`` header:
the retry counter lives there, never in x-death (RabbitMQ 3.13+ stopped counting x-death on
client-republished messages; 4.x treats x-* headers as the broker's).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pika

from amqp_lab.errors import InvalidMessage

JSON = "application/json"
ATTEMPTS_HEADER = "attempts"
FIRST_SEEN_HEADER = "first_seen_at"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to publish. ``body`` is bytes; ``timestamp`` in seconds (None: now)."""

    body: bytes
    message_id: str
    exchange: str = "tasks"
    routing_key: str = "task"
    content_type: str = JSON
    headers: dict[str, Any] = field(default_factory=dict)
    persistent: bool = True
    timestamp: int | None = None
    type: str | None = None
    expiration: str | None = None  # per-message TTL, whole milliseconds as a string

    def properties(self) -> pika.BasicProperties:
        """AMQP basic properties: delivery_mode 2 (persistent) unless ``persistent`` is False."""
        return pika.BasicProperties(
            content_type=self.content_type,
            delivery_mode=2 if self.persistent else 1,
            message_id=self.message_id,
            timestamp=self.timestamp if self.timestamp is not None else int(time.time()),
            headers=dict(self.headers) or None,
            type=self.type,
            expiration=self.expiration,
        )


def encode_json(value: Any) -> bytes:
    """Compact, deterministic JSON bytes (UTF-8)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def task_message(
    kind: str,
    seq: int,
    message_id: str | None = None,
    *,
    exchange: str = "tasks",
    routing_key: str = "task",
    persistent: bool = True,
) -> OutgoingMessage:
    """The lab task ``{"kind": kind, "seq": seq}`` with ``attempts: 0``; uuid4 if no id."""
    return OutgoingMessage(
        body=encode_json({"kind": kind, "seq": seq}),
        message_id=message_id or str(uuid.uuid4()),
        exchange=exchange,
        routing_key=routing_key,
        headers={ATTEMPTS_HEADER: 0},
        persistent=persistent,
    )


@dataclass(frozen=True, slots=True)
class Task:
    """A decoded task delivery, handed to the handler."""

    message_id: str
    body: dict[str, Any]
    headers: dict[str, Any]
    exchange: str
    routing_key: str
    redelivered: bool
    attempt: int  # 1 on the first delivery; see settlement.attempt_number

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))


def header_attempts(headers: dict[str, Any] | None) -> int:
    """Our ``attempts`` header as an int (0 when absent). Raises InvalidMessage when it is not a
    non-negative integer (e.g. the string "3")."""
    value = (headers or {}).get(ATTEMPTS_HEADER, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidMessage(f"header 'attempts' must be a non-negative integer, got {value!r}")
    return value


def decode_body(
    body: bytes, content_type: str | None, max_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> dict[str, Any]:
    """Decode a task body: a UTF-8 JSON object whose ``kind`` is a string.

    Raises InvalidMessage with the reason (empty, too large, unknown content type, not UTF-8,
    not JSON, not an object, bad ``kind``).
    """
    if content_type not in (None, "", JSON) and not content_type.startswith(JSON + ";"):
        raise InvalidMessage(f"unsupported content_type {content_type!r}, expected {JSON}")
    if not body:
        raise InvalidMessage("empty body")
    if len(body) > max_bytes:
        raise InvalidMessage(f"body of {len(body)} bytes exceeds the limit of {max_bytes}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidMessage(f"body is not UTF-8: {e.reason} at byte {e.start}") from e
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidMessage(f"body is not JSON: {e}") from e
    except RecursionError as e:
        raise InvalidMessage("body is JSON nested too deeply") from e
    if not isinstance(value, dict):
        raise InvalidMessage(f"body must be a JSON object, got {type(value).__name__}")
    if not isinstance(value.get("kind"), str):
        raise InvalidMessage("body field 'kind' must be a string")
    return value
