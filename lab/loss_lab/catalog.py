"""The designs the loss lab compares: key -> title, family (redis or rabbit) and how each
recovers a worker crash (pure data)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DesignSpec:
    title: str
    family: str
    recovery: str


DESIGNS: dict[str, DesignSpec] = {
    "brpop": DesignSpec(
        "1. Redis list LPUSH/BRPOP",
        "redis",
        "none: the pop removed it; a kill before the effect loses it",
    ),
    "lmove": DesignSpec(
        "2. Redis LMOVE + reaper",
        "redis",
        "reaper moves entries stale in the processing list back (at-least-once)",
    ),
    "xstream": DesignSpec(
        "3. Redis Streams XREADGROUP/XACK",
        "redis",
        "pending entry XAUTOCLAIMed after the idle time, XACK after the effect",
    ),
    "xstream-maxlen": DesignSpec(
        "3b. Redis Streams with MAXLEN ~",
        "redis",
        "as 3; entries trimmed before they were read are gone",
    ),
    "autoack": DesignSpec(
        "4. RabbitMQ auto-ack",
        "rabbit",
        "none: the broker forgot each message when it sent it; the buffer dies with the worker",
    ),
    "manual": DesignSpec(
        "5. RabbitMQ manual ack",
        "rabbit",
        "unacked deliveries requeued when the connection dies; redelivered",
    ),
    "dedup": DesignSpec(
        "6. RabbitMQ manual ack + dedup",
        "rabbit",
        "redelivered; the message_id claim (same transaction as the effect) skips a re-run",
    ),
    "stream": DesignSpec(
        "7. RabbitMQ stream + stored offset",
        "rabbit",
        "re-read from the stored offset (x-stream-offset); entries after it run again",
    ),
}
