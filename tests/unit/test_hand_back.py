"""What goes back to the queue unstarted goes back with basic.nack (not counted by 4.3+ quorum
queues), a failure with basic.reject (counted on every version); pika's own cancel() would
reject what it holds."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from amqp_lab.consuming.settling import cancel_handing_back, hand_back

pytestmark = pytest.mark.unit


class FakeChannel:
    def __init__(self, pending: list[int]) -> None:
        self.calls: list[tuple[str, Any]] = []
        events = deque(SimpleNamespace(method=SimpleNamespace(delivery_tag=t)) for t in pending)
        self._queue_consumer_generator = SimpleNamespace(pending_events=events)

    def basic_nack(self, tag: int, requeue: bool) -> None:
        self.calls.append(("nack", (tag, requeue)))

    def basic_reject(self, tag: int, requeue: bool) -> None:  # what pika's cancel() would do
        self.calls.append(("reject", (tag, requeue)))

    def get_waiting_message_count(self) -> int:
        return len(self._queue_consumer_generator.pending_events)

    def cancel(self) -> int:
        for evt in self._queue_consumer_generator.pending_events:
            self.basic_reject(evt.method.delivery_tag, True)
        self.calls.append(("cancel", None))
        return 0


def test_hand_back_is_a_nack_with_requeue() -> None:
    channel = FakeChannel([])
    hand_back(channel, 7)
    assert channel.calls == [("nack", (7, True))]


def test_cancel_hands_back_what_pika_holds_before_basic_cancel() -> None:
    channel = FakeChannel([4, 5, 6])
    cancel_handing_back(channel)
    assert channel.calls == [
        ("nack", (4, True)),
        ("nack", (5, True)),
        ("nack", (6, True)),
        ("cancel", None),
    ]


def test_cancel_without_pikas_internals_falls_back_to_pikas_cancel() -> None:
    channel = FakeChannel([])
    del channel._queue_consumer_generator

    def cancel() -> int:
        channel.calls.append(("cancel", None))
        return 0

    channel.cancel = cancel  # type: ignore[method-assign]
    cancel_handing_back(channel)
    assert channel.calls == [("cancel", None)]
