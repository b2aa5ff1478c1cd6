"""The DLQ: records that explain a failure (:mod:`amqp_lab.dlq.record`, pure), how a person
reads any DLQ message and what a replay sends (:mod:`amqp_lab.dlq.view`, pure) and the
operations on the queue (:mod:`amqp_lab.dlq.ops`): browse without consuming, depth, replay,
delete; grouping by failure (:mod:`amqp_lab.dlq.fingerprint`, pure) and the audit log of what
a person did (:mod:`amqp_lab.dlq.audit_log`)."""

from amqp_lab.dlq.ops import DeleteResult, ReplayResult, browse, delete, depth, replay
from amqp_lab.dlq.view import DlqEntry, DlqSummary, Selection, replay_message, summarize, view_of

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
