"""Messages as values: what the publisher sends and what a consumer decodes (pure, no I/O).

Every message amqp-lab publishes is persistent (delivery_mode 2), has a ``message_id`` and a
``timestamp`` (seconds since the epoch, AMQP's unit), and carries our own ``attempts`` header:
the retry counter lives there, never in x-death (RabbitMQ 3.13+ stopped counting x-death on
client-republished messages; 4.x treats x-* headers as the broker's).
"""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from amqp_lab.errors import ConfigurationError, InvalidMessage, UnencodableMessage
from amqp_lab.fieldtable import FieldTableError
from amqp_lab.json_codec import decode_json, encode_json, parse_json
from amqp_lab.topology.model import Names
from amqp_lab.wire import AmqpProperties

__all__ = [
    "ATTEMPTS_HEADER",
    "BOOKKEEPING_HEADERS",
    "BROKER_HEADERS",
    "DEFAULT_MAX_BODY_BYTES",
    "FIRST_SEEN_HEADER",
    "JSON",
    "KEY_HEADER",
    "MAX_EXPIRATION_MS",
    "MAX_PROPERTIES_BYTES",
    "ORIGINAL_EXCHANGE_HEADER",
    "ORIGINAL_ROUTING_KEY_HEADER",
    "PROPERTY_NAMES",
    "REPLAYED_PROPERTIES",
    "OutgoingMessage",
    "Publishable",
    "Task",
    "decode_body",
    "decode_json",
    "encode_json",
    "header_attempts",
    "is_json",
    "message_for",
    "not_a_short_string",
    "original_destination",
    "properties_of",
    "user_headers",
]

JSON = "application/json"
ATTEMPTS_HEADER = "attempts"
KEY_HEADER = "key"  # the entity key of per-key ordering (docs/ordering.md)
FIRST_SEEN_HEADER = "first_seen_at"
ORIGINAL_EXCHANGE_HEADER = "original_exchange"
ORIGINAL_ROUTING_KEY_HEADER = "original_routing_key"
BOOKKEEPING_HEADERS = frozenset(
    {ATTEMPTS_HEADER, FIRST_SEEN_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER}
)
"""Headers amqp-lab itself writes on retry copies; a replay starts them afresh."""
BROKER_HEADERS = frozenset(
    {
        "x-death",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
        "x-delivery-count",
        "x-acquired-count",
    }
)
"""Headers the broker writes (dead-lettering, quorum queue delivery counts); never replayed,
never copied into a retry. Every other header, ``x-`` prefixed or not, is the publisher's."""
REPLAYED_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "priority",
    "type",
    "app_id",
    "timestamp",
)
"""Properties a replay sends again as they were. Not replayed: ``expiration`` (its time has
passed), ``user_id`` (the broker refuses one that is not the publishing user),
``delivery_mode`` (a replay is always persistent) and ``message_id`` (kept separately)."""


DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MAX_PROPERTIES_BYTES = 131_072 - 8 - 12
"""The most encoded properties one content-header frame carries at pika's and RabbitMQ's
default frame_max (131072, less 8 octets of frame and 12 of class, weight and body size).
A larger header frame makes RabbitMQ close the whole connection (501 FRAME_ERROR
frame_too_large; checked on 3.10.8 and 4.0.5)."""
MAX_EXPIRATION_MS = 315_360_000_000
"""The largest per-message TTL RabbitMQ accepts (ten years in milliseconds; measured on 3.10.8
and 4.0.5: one more is refused with 406 PRECONDITION_FAILED, which closes the channel)."""


class Publishable(Protocol):
    """What a publisher's I/O thread reads of a publish whose properties are already sealed:
    its destination, body and message_id. An :class:`OutgoingMessage` is one; so is an outbox
    row (:class:`amqp_lab.outbox.row.OutboxRow`), which the relay publishes without making a
    message of it (:mod:`amqp_lab.outbox.sealing`)."""

    @property
    def message_id(self) -> str: ...

    @property
    def exchange(self) -> str: ...

    @property
    def routing_key(self) -> str: ...

    @property
    def body(self) -> bytes: ...


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to publish. ``body`` is bytes; ``timestamp`` in seconds (None: now)."""

    body: bytes
    message_id: str
    exchange: str = ""  # AMQP's default exchange: name them (see message_for)
    routing_key: str = ""
    content_type: str = JSON
    headers: dict[str, Any] = field(default_factory=dict)
    persistent: bool = True
    timestamp: int | None = None
    type: str | None = None
    expiration: str | None = None  # per-message TTL, whole milliseconds as a string
    priority: int | None = None  # 0..255
    correlation_id: str | None = None
    reply_to: str | None = None
    content_encoding: str | None = None
    app_id: str | None = None

    def properties(self) -> AmqpProperties:
        """AMQP basic properties: delivery_mode 2 (persistent) unless ``persistent`` is False.
        Not yet checked: see :meth:`sealed_properties`."""
        return AmqpProperties(
            content_type=self.content_type,
            content_encoding=self.content_encoding,
            delivery_mode=2 if self.persistent else 1,
            message_id=self.message_id,
            timestamp=self.timestamp if self.timestamp is not None else int(time.time()),
            headers=dict(self.headers) or None,
            type=self.type,
            expiration=self.expiration,
            priority=self.priority,
            correlation_id=self.correlation_id,
            reply_to=self.reply_to,
            app_id=self.app_id,
        )

    def sealed_properties(self) -> AmqpProperties:
        """The properties, checked and encoded once, before anything is sent. Raises
        UnencodableMessage (naming the message_id and the field) when the broker would refuse
        them by closing the channel, or pika could not encode them: ``expiration`` not a string
        of digits within 0..MAX_EXPIRATION_MS, ``priority`` outside 0..255, a short string over
        255 bytes, a header value AMQP cannot carry (a set, an int beyond 64 bits...),
        properties larger than one frame (MAX_PROPERTIES_BYTES), an exchange or routing key
        that is no AMQP short string (not text, a lone surrogate, over 255 bytes)."""
        if self.expiration is not None and not (
            isinstance(self.expiration, str)
            and self.expiration.isascii()
            and self.expiration.isdigit()
            and int(self.expiration) <= MAX_EXPIRATION_MS
        ):
            raise UnencodableMessage(
                f"message_id={self.message_id!r}: expiration must be a string of whole "
                f"milliseconds within 0..{MAX_EXPIRATION_MS}, got {self.expiration!r}",
                self.message_id,
            )
        for name, value in (("exchange", self.exchange), ("routing key", self.routing_key)):
            problem = not_a_short_string(value)
            if problem:  # pika would fail inside basic.publish, looking like a lost connection
                raise UnencodableMessage(
                    f"message_id={self.message_id!r}: the {name} {problem}", self.message_id
                )
        try:
            sealed = self.properties().seal()
        except FieldTableError as e:
            raise UnencodableMessage(f"message_id={self.message_id!r}: {e}", self.message_id) from e
        size = len(sealed.encode()[0])
        if size > MAX_PROPERTIES_BYTES:
            raise UnencodableMessage(
                f"message_id={self.message_id!r}: its properties and headers take {size} bytes, "
                f"more than one frame carries ({MAX_PROPERTIES_BYTES}): RabbitMQ would close "
                "the connection (501 FRAME_ERROR)",
                self.message_id,
            )
        return sealed


def not_a_short_string(value: Any) -> str | None:
    """Why ``value`` cannot be an AMQP short string (exchange, routing key), or None."""
    if not isinstance(value, str):
        return f"must be a str, not {type(value).__name__}"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{value[:40]!r} is not Unicode text (a lone surrogate)"
    return f"{value[:40]!r}... is longer than 255 bytes" if size > 255 else None


def user_headers(headers: dict[Any, Any] | None) -> dict[Any, Any]:
    """The publisher's headers: without the broker's (:data:`BROKER_HEADERS`) and amqp-lab's
    bookkeeping, in their original order and types."""
    return {
        k: v
        for k, v in (headers or {}).items()
        if k not in BROKER_HEADERS and k not in BOOKKEEPING_HEADERS
    }


def original_destination(
    headers: dict[Any, Any] | None, exchange: str, routing_key: str
) -> tuple[str, str]:
    """Where the message was first published: our ``original_exchange`` /
    ``original_routing_key`` headers, written on the first retry hop, else the delivery's."""
    headers = headers or {}
    original_exchange = headers.get(ORIGINAL_EXCHANGE_HEADER)
    original_key = headers.get(ORIGINAL_ROUTING_KEY_HEADER)
    if isinstance(original_exchange, str) and isinstance(original_key, str):
        return original_exchange, original_key
    return exchange, routing_key


def properties_of(properties: Any) -> dict[str, Any]:
    """A delivery's basic properties by name, without ``headers`` and ``message_id`` (kept
    apart) and without the ones not set."""
    return {
        name: value
        for name in PROPERTY_NAMES
        if (value := getattr(properties, name, None)) is not None
    }


PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


def message_for(
    names: Names,
    body: Any,
    *,
    message_id: str | None = None,
    headers: dict[str, Any] | None = None,
    content_type: str | None = None,
    key: str | None = None,
    **properties: Any,
) -> OutgoingMessage:
    """A message to the topology's work exchange and routing key (``names``): ``body`` as is
    when it is bytes (content type ``application/octet-stream`` unless given), else as compact
    JSON (``application/json``); a uuid4 message_id unless given; ``properties`` are further
    :class:`OutgoingMessage` fields (priority, correlation_id...).

    ``key``: the entity key of per-key ordering (an order id, an account...), carried in the
    ``key`` header (:data:`KEY_HEADER`) and used as the routing key, which the ordered
    topology's consistent-hash exchange hashes onto a shard (docs/ordering.md). Raises
    ConfigurationError for an ordered topology without a key (every message would hash to one
    shard), or a key that is empty, not Unicode text (a lone surrogate) or longer than 255
    bytes in UTF-8 (AMQP's shortstr limit for a routing key); UnencodableMessage for a body
    that is not bytes and has no standard JSON form (:func:`encode_json`: NaN, Infinity, a
    lone surrogate, a set...)."""
    routing_key = names.routing_key
    headers = dict(headers or {})
    message_id = message_id or str(uuid.uuid4())
    if key is not None:
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            size = 0
        if not 1 <= size <= 255:
            raise ConfigurationError(
                f"a key must be 1..255 bytes of UTF-8 (it is the routing key), not {key!r:.80}"
            )
        headers[KEY_HEADER] = key
        routing_key = key
    elif names.shards:
        raise ConfigurationError(
            "the ordered topology routes by key: give each message a key (key=, publish.py "
            "--key), or every message hashes onto one shard"
        )
    if isinstance(body, bytes | bytearray):
        raw, default_type = bytes(body), "application/octet-stream"
    else:
        try:
            raw, default_type = encode_json(body), JSON
        except (ValueError, TypeError, RecursionError) as e:
            raise UnencodableMessage(
                f"message_id={message_id!r}: the body is not standard JSON: {e}", message_id
            ) from e
    return OutgoingMessage(
        body=raw,
        message_id=message_id,
        exchange=names.exchange,
        routing_key=routing_key,
        content_type=content_type or default_type,
        headers=headers,
        **properties,
    )


@dataclass(slots=True)
class Task:
    """A delivery, handed to the handler: ``body`` the decoded JSON value for a JSON content
    type (or none), else the bytes; ``headers`` a copy of the publisher's; ``attempt`` 1 on the
    first delivery. The body's schema is the handler's to check (BusinessError if unusable).
    Not frozen (4x the cost to build, per delivery: docs/benchmarks.md). Nothing reads it back,
    but the ordered consumer's in-worker retry hands the next try a copy of it, as changed."""

    message_id: str
    body: Any
    headers: dict[str, Any]
    exchange: str
    routing_key: str
    redelivered: bool
    attempt: int
    content_type: str | None = None


def header_attempts(headers: dict[str, Any] | None) -> int:
    """Our ``attempts`` header as an int (0 when absent). Raises InvalidMessage when it is not a
    non-negative integer (e.g. the string "3")."""
    value = (headers or {}).get(ATTEMPTS_HEADER, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidMessage(f"header 'attempts' must be a non-negative integer, got {value!r}")
    return value


@functools.lru_cache(maxsize=256)
def is_json(content_type: str | None) -> bool:
    """Whether a body of this content type is read as JSON: none given, ``application/json``
    (with parameters) or a ``+json`` type. Cached: a queue carries few content types."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON or media.endswith("+json")


def decode_body(
    body: bytes, content_type: str | None, max_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> Any:
    """The body as the handler receives it: the parsed JSON value for a JSON content type
    (:func:`is_json`), else the bytes. Raises InvalidMessage with the reason: too large, and
    for JSON empty, not UTF-8, not standard JSON (``NaN`` and ``Infinity`` are refused, as
    :func:`decode_json` does) or nested too deeply."""
    if len(body) > max_bytes:
        raise InvalidMessage(f"body of {len(body)} bytes exceeds the limit of {max_bytes}")
    if not is_json(content_type):
        return body
    if not body:
        raise InvalidMessage("empty body")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidMessage(f"body is not UTF-8: {e.reason} at byte {e.start}") from e
    try:
        return parse_json(text)
    except ValueError as e:
        raise InvalidMessage(f"body is not JSON: {e}") from e
    except RecursionError as e:
        raise InvalidMessage("body is JSON nested too deeply") from e
