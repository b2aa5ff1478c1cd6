"""RabbitMQ 3.x and 4.x report a classic queue's arguments differently; verify treats both alike."""

from __future__ import annotations

import pytest

from amqp_lab.topology import Queue, live_queue_arguments

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        ({"arguments": {}}, {}),  # 3.x
        ({"arguments": {"x-queue-type": "classic"}}, {}),  # 4.x default recorded
        ({"arguments": {"x-queue-type": "quorum"}}, {"x-queue-type": "quorum"}),  # real drift
        ({"arguments": {"x-max-length": 5}}, {"x-max-length": 5}),
        ({}, {}),
    ],
)
def test_default_queue_type_is_not_drift(
    live: dict[str, object], expected: dict[str, object]
) -> None:
    assert live_queue_arguments(live, Queue("q:tasks")) == expected


def test_a_declared_queue_type_is_kept() -> None:
    queue = Queue("q:tasks", arguments=(("x-queue-type", "classic"),))
    assert live_queue_arguments({"arguments": {"x-queue-type": "classic"}}, queue) == {
        "x-queue-type": "classic"
    }
