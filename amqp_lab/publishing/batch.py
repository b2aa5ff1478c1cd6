"""The outcome of a pipelined publish, one at a time (:data:`Outcome`, a callback) or for a
whole batch (:class:`PublishBatch`, without a Future per message)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from amqp_lab.errors import AmqpLabError, PublishFailed
from amqp_lab.message import OutgoingMessage

__all__ = ["Outcome", "PublishBatch"]


Outcome = Callable[[OutgoingMessage, AmqpLabError | None], None]
"""``callback(message, error)``: error is None when the broker confirmed the message."""


class PublishBatch:
    """Outcomes of one :meth:`PipelinedPublisher.publish_many` call, without a Future per
    message: ``confirmed`` counts acks, ``failures`` lists (message, error)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.confirmed = 0
        self.failures: list[tuple[OutgoingMessage, AmqpLabError]] = []
        self._done = threading.Event()
        if size == 0:
            self._done.set()

    def _record(self, message: OutgoingMessage, error: AmqpLabError | None) -> None:
        # only the publisher's I/O thread writes here: no lock per message
        if error is None:
            self.confirmed += 1
        else:
            self.failures.append((message, error))
        if self.confirmed + len(self.failures) == self.size:
            self._done.set()

    def wait(self, timeout: float | None = 120) -> PublishBatch:
        """Block until every message of the batch has an outcome; raises PublishFailed after
        ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise PublishFailed(f"batch: outcomes still pending after {timeout} s")
        return self
