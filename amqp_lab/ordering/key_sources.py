"""Where the keys of a distribution report come from (docs/ordering.md): a sample file, the
DLQ, the audit queue - read without consuming - or the real shard queues' statistics.

Ordered messages carry their entity key in the ``key`` header (:data:`KEY_HEADER`), a string,
and are published with routing key = the key, so a key is at most 255 bytes of UTF-8 (AMQP's
short-string limit on routing keys). A sample file has one key per line, or JSON lines with
the key in a field; :func:`parse_sample` names the line of anything it cannot read.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from amqp_lab.audit.reader import StreamReader
from amqp_lab.dlq.ops import browse
from amqp_lab.errors import ConfigurationError, ManagementError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings

__all__ = [
    "KEY_HEADER",
    "MAX_KEY_BYTES",
    "SHARD_QUEUE_TEMPLATE",
    "HeaderKeys",
    "ShardStats",
    "check_key",
    "dlq_keys",
    "keys_from_headers",
    "parse_sample",
    "queue_keys",
    "shard_stats",
    "zipf_sample",
]

KEY_HEADER = "key"
MAX_KEY_BYTES = 255
SHARD_QUEUE_TEMPLATE = "q:tasks:shard:{n}"

SampleFormat = Literal["auto", "lines", "jsonl"]


def check_key(key: str, where: str) -> str:
    """``key`` if it can be a routing key (1..255 bytes of UTF-8), else ConfigurationError
    naming ``where``."""
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > MAX_KEY_BYTES:
        raise ConfigurationError(
            f"{where}: key is {size} bytes, over AMQP's {MAX_KEY_BYTES}-byte routing-key limit"
        )
    return key


def parse_sample(
    lines: Iterable[bytes], *, field: str = KEY_HEADER, fmt: SampleFormat = "auto", name: str = "-"
) -> list[str]:
    """Keys from a sample file's raw lines, one per message. Blank lines are skipped and each
    key is stripped of surrounding whitespace. ``fmt`` "auto" reads JSON lines when the first
    non-blank line starts with ``{``. In JSON lines the key is ``field`` (a string, or an
    integer written in decimal). Raises ConfigurationError naming ``name:line`` for a line
    that is not UTF-8, not a JSON object, lacks the field, or holds a key over 255 bytes."""
    keys: list[str] = []
    mode = fmt
    for number, raw in enumerate(lines, 1):
        where = f"{name}:{number}"
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise ConfigurationError(
                f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
            ) from e
        if not text:
            continue
        if mode == "auto":
            mode = "jsonl" if text.startswith("{") else "lines"
        keys.append(check_key(_json_key(text, field, where) if mode == "jsonl" else text, where))
    return keys


def _json_key(text: str, field: str, where: str) -> str:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConfigurationError(f"{where}: not JSON ({e})") from e
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where}: a JSON {type(value).__name__}, not an object")
    if field not in value:
        raise ConfigurationError(f"{where}: no field {field!r} (use --field to name another)")
    key = value[field]
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise ConfigurationError(f"{where}: field {field!r} is {type(key).__name__}, not a string")
    return str(key)


@dataclass(frozen=True)
class HeaderKeys:
    """Keys read from messages' headers; ``unkeyed``: messages without a usable key header."""

    keys: tuple[str, ...]
    unkeyed: int


def keys_from_headers(headers: Iterable[dict[Any, Any] | None]) -> HeaderKeys:
    """The ``key`` header of each message (a string; bytes are read as UTF-8, bad bytes as
    ``\\xNN``). Messages without it, or with one that no ordered message can carry - empty,
    not text, or over 255 bytes (no routing key holds it; a foreign publisher may send any
    header), or with a lone surrogate (a DLQ record's typed headers can hold one) - count as
    unkeyed."""
    keys: list[str] = []
    unkeyed = 0
    for table in headers:
        value = (table or {}).get(KEY_HEADER) if isinstance(table, dict) else None
        if isinstance(value, bytes):
            value = value.decode("utf-8", "backslashreplace")
        if isinstance(value, str) and 0 < _utf8_size(value) <= 255:
            keys.append(value)
        else:
            unkeyed += 1
    return HeaderKeys(tuple(keys), unkeyed)


def _utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8; 0 for a string with a lone surrogate (no routing key)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return 0


def dlq_keys(settings: BrokerSettings, queue: str, limit: int | None = None) -> HeaderKeys:
    """The keys of the messages in the DLQ ``queue``, left in place (basic.get, then nack with
    requeue: :func:`amqp_lab.dlq.ops.browse`). A dead-letter record keeps the message's
    original headers, so the key is the original message's. Raises NotFound if it is
    missing."""
    return keys_from_headers(entry.headers for entry in browse(settings, queue, limit))


def queue_keys(settings: BrokerSettings, queue: str, limit: int | None = None) -> HeaderKeys:
    """The keys of the messages in a queue such as the audit queue. A classic or quorum queue
    is read the same way as the DLQ (basic.get without ack, then all requeued in place; only
    their redelivered flag changes); a stream (``--audit stream``; the management API says
    its type) is read from its first offset with :class:`amqp_lab.audit.StreamReader`, which
    stores no offset and leaves the stream as it was. Raises ManagementError when the API
    cannot tell the type, QueueNotFound for a missing queue."""
    with ManagementClient(settings) as api:
        info = api.queue(settings.vhost, queue) or {}
    if info.get("type") != "stream":
        return dlq_keys(settings, queue, limit)
    headers: list[dict[Any, Any]] = []
    StreamReader(settings, queue).read(
        lambda entry: headers.append(entry.headers), "first", limit=limit, idle_timeout=1.0
    )
    return keys_from_headers(headers)


@dataclass(frozen=True)
class ShardStats:
    """One real shard queue per the management API: ``messages`` (ready + unacked) and
    ``publish_rate`` (messages/s over the API's sampling window; 0.0 without stats)."""

    shard: int
    queue: str
    messages: int
    publish_rate: float


def shard_stats(
    api: ManagementClient,
    vhost: str,
    shards: int,
    template: str = SHARD_QUEUE_TEMPLATE,
) -> list[ShardStats]:
    """GET /api/queues/{vhost}/{name} for each shard queue ``template.format(n=1..shards)``.
    Raises ManagementError (404) naming a missing shard queue."""
    stats: list[ShardStats] = []
    for n in range(1, shards + 1):
        name = template.format(n=n)
        info = api.queue(vhost, name)
        if info is None:
            raise ManagementError(f"shard queue {name!r} not found in vhost {vhost!r}", 404)
        details = (info.get("message_stats") or {}).get("publish_details") or {}
        stats.append(
            ShardStats(n, name, int(info.get("messages") or 0), float(details.get("rate") or 0.0))
        )
    return stats


def zipf_sample(keys: int, messages: int, s: float, seed: int = 1) -> list[str]:
    """A reproducible skewed sample: ``messages`` keys out of ``key-0001``.. with weights
    1/rank**s (s=0: uniform), split exactly by largest remainder, then shuffled with
    ``seed``. Every key gets its rounded count (possibly 0 for a long tail)."""
    if keys < 1 or messages < 0 or s < 0:
        raise ConfigurationError("expected keys >= 1, messages >= 0, zipf exponent >= 0")
    width = max(4, len(str(keys)))
    names = [f"key-{i:0{width}d}" for i in range(1, keys + 1)]
    counts = _apportion([1.0 / rank**s for rank in range(1, keys + 1)], messages)
    sample = [name for name, n in zip(names, counts, strict=True) for _ in range(n)]
    random.Random(seed).shuffle(sample)
    return sample


def _apportion(weights: Sequence[float], total: int) -> list[int]:
    """Integer counts proportional to ``weights`` summing to ``total`` (largest remainder;
    ties go to the heavier, earlier weight)."""
    whole = sum(weights)
    exact = [w * total / whole for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts
