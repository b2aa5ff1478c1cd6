"""The audit log as a stream: an offset-tracking reader and its offset store
(docs/audit-stream.md)."""

from amqp_lab.audit.offsets import (
    DEFAULT_OFFSET_FILE,
    OffsetStore,
    ReaderKey,
    Start,
    parse_start,
    removed_before,
)
from amqp_lab.audit.reader import ReadReport, StreamEntry, StreamReader

__all__ = [
    "DEFAULT_OFFSET_FILE",
    "OffsetStore",
    "ReadReport",
    "ReaderKey",
    "Start",
    "StreamEntry",
    "StreamReader",
    "parse_start",
    "removed_before",
]
