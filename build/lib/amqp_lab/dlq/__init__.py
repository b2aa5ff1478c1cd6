"""The DLQ: records that explain a failure (:mod:`amqp_lab.dlq.record`, pure) and the
operations on the queue (:mod:`amqp_lab.dlq.ops`): browse without consuming, depth, replay."""

from amqp_lab.dlq.ops import ReplayResult, browse, depth, replay
from amqp_lab.dlq.record import DlqEntry, DlqSummary, Selection, replay_message, summarize, view_of

__all__ = [
    "DlqEntry",
    "DlqSummary",
    "ReplayResult",
    "Selection",
    "browse",
    "depth",
    "replay",
    "replay_message",
    "summarize",
    "view_of",
]
