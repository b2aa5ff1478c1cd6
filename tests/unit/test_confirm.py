"""The one map from a broker reply to a publish outcome (amqp_lab.publishing.confirm): every
reply, and the blocking channel's answers."""

from __future__ import annotations

from typing import Any

import pika.exceptions as pe
import pytest

from amqp_lab.errors import MessageNacked, MessageUnroutable, PublishFailed
from amqp_lab.message import OutgoingMessage
from amqp_lab.publishing.confirm import (
    Reply,
    outcome_error,
    publish_and_wait,
)

pytestmark = pytest.mark.unit

MESSAGE = OutgoingMessage(body=b"{}", message_id="m-1", exchange="tasks", routing_key="task")


def test_an_ack_is_no_error() -> None:
    assert outcome_error(Reply.ACK, MESSAGE) is None


def test_a_return_is_unroutable_naming_exchange_and_routing_key() -> None:
    error = outcome_error(Reply.RETURNED, MESSAGE)
    assert isinstance(error, MessageUnroutable) and error.message_id == "m-1"
    assert str(error) == (
        "returned unroutable: exchange 'tasks' has no queue bound for routing key 'task'"
    )


@pytest.mark.parametrize(("tries", "times"), [(1, "once"), (3, "3 times")])
def test_a_nack_counts_the_tries(tries: int, times: str) -> None:
    error = outcome_error(Reply.NACKED, MESSAGE, tries=tries)
    assert isinstance(error, MessageNacked)
    assert str(error) == f"nacked by the broker {times} (exchange 'tasks' routing key 'task')"


@pytest.mark.parametrize(
    ("reply", "why"),
    [(Reply.LOST, "the connection was lost"), (Reply.CLOSED, "the channel was closed")],
)
def test_lost_and_closed_are_not_confirmed(reply: Reply, why: str) -> None:
    error = outcome_error(reply, MESSAGE, tries=2, detail="404 NOT_FOUND")
    assert isinstance(error, PublishFailed) and error.message_id == "m-1"
    assert str(error) == (
        f"not confirmed after 2 attempts: {why} (exchange 'tasks' routing key 'task'): "
        "404 NOT_FOUND"
    )


class Channel:
    def __init__(self, raises: BaseException | None) -> None:
        self.raises = raises
        self.published: list[tuple[Any, ...]] = []

    def basic_publish(self, *args: Any, mandatory: bool) -> None:
        self.published.append((*args, mandatory))
        if self.raises is not None:
            raise self.raises


@pytest.mark.parametrize(
    ("raises", "reply"),
    [
        (None, Reply.ACK),
        (pe.UnroutableError([]), Reply.RETURNED),
        (pe.NackError([]), Reply.NACKED),
    ],
)
def test_publish_and_wait_reads_the_blocking_channel(
    raises: BaseException | None, reply: Reply
) -> None:
    channel = Channel(raises)
    assert publish_and_wait(channel, MESSAGE, "props") == reply
    assert channel.published == [("tasks", "task", b"{}", "props", True)]


def test_a_closed_channel_is_for_the_caller_to_translate() -> None:
    with pytest.raises(pe.ChannelClosedByBroker):
        publish_and_wait(Channel(pe.ChannelClosedByBroker(404, "NOT_FOUND")), MESSAGE, None)
