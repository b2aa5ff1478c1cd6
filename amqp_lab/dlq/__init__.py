"""The DLQ, pure record apart from I/O.

Pure (no broker, no file): the records that explain a failure (:mod:`.record`, and
:mod:`.raw_record` for a body the record cannot hold), how a person reads any DLQ message and
what a replay sends (:mod:`.view`), choosing and counting entries (:mod:`.summary`) and
grouping by failure (:mod:`.fingerprint`). I/O: the operations on the queue (:mod:`.ops`:
browse without consuming, depth, replay, delete), the bounded pass they run (:mod:`.window`)
and the audit log of what a person did (:mod:`.audit_log`).

The package imports nothing itself: the consumer, which writes records, loads no broker
operation. The names below are looked up in their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DeleteResult",
    "DlqEntry",
    "DlqSummary",
    "ReplayResult",
    "Selection",
    "browse",
    "delete",
    "depth",
    "replay",
    "replay_message",
    "summarize",
    "view_of",
]

_HOME = {
    "DeleteResult": "ops",
    "ReplayResult": "ops",
    "browse": "ops",
    "delete": "ops",
    "depth": "ops",
    "replay": "ops",
    "DlqEntry": "view",
    "replay_message": "view",
    "view_of": "view",
    "DlqSummary": "summary",
    "Selection": "summary",
    "summarize": "summary",
}


def __getattr__(name: str) -> Any:
    """``amqp_lab.dlq.browse`` and the other names of ``__all__``, from their modules."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
