"""Where RabbitMQ 3.x and 4.x differ, and why amqp-lab counts attempts in its own header."""

from __future__ import annotations

from typing import Any

import pika
import pytest

from amqp_lab.connection import open_channel
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from tests.support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.foundation]


def major(settings: BrokerSettings) -> int:
    with ManagementClient(settings) as api:
        return int(api.overview()["rabbitmq_version"].split(".")[0])


def reject_into_dlq(channel: Any, body: bytes, props: Any) -> tuple[Any, bytes]:
    """Publish, basic.reject(requeue=False) from q:tasks, and take the copy from the DLQ."""
    channel.basic_publish("tasks", "task", body, props, mandatory=True)
    method, _, _ = wait_for(
        lambda: (r := channel.basic_get("q:tasks")) and r[0] and r,
        what="message in q:tasks",
    )
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, dead_props, dead_body = wait_for(
        lambda: (r := channel.basic_get("q:tasks:dlq", auto_ack=True)) and r[0] and r,
        what="message in q:tasks:dlq",
    )
    channel.basic_get("q:tasks:audit", auto_ack=True)
    return dead_props, dead_body


def test_x_death_count_of_a_client_republished_message(topology: BrokerSettings) -> None:
    with open_channel(topology) as channel:
        channel.confirm_delivery()
        props = pika.BasicProperties(message_id="xd", delivery_mode=2, headers={"attempts": 0})
        first, body = reject_into_dlq(channel, b"{}", props)
        assert first.headers["x-death"][0]["count"] == 1
        # a client republishes the dead-lettered message as it is, x-death header included
        again, _ = reject_into_dlq(channel, body, first)
    count = again.headers["x-death"][0]["count"]
    # 3.x counts the client-supplied x-death; 4.x reserves x-* headers for the broker and
    # starts over. So x-death cannot count our retries: the `attempts` header does.
    assert count == (2 if major(topology) == 3 else 1)
