"""Durability demo: persistent messages in a durable queue survive a broker restart; transient
(delivery_mode 1) ones do not (symfony #34685). https://www.rabbitmq.com/docs/persistence-conf
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import pika.exceptions as pe

from amqp_lab.connection import open_channel, translate
from amqp_lab.errors import BrokerConnectionError
from amqp_lab.message import OutgoingMessage, encode_json
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings

DEMO_QUEUE = "q:durability-demo"


@dataclass(frozen=True)
class DurabilityResult:
    published: int  # of each kind, all confirmed
    persistent_survived: int
    transient_survived: int

    def line(self) -> str:
        n = self.published
        return (
            f"persistent survived={self.persistent_survived}/{n} "
            f"transient survived={self.transient_survived}/{n}"
        )


def run_restart_demo(
    settings: BrokerSettings,
    restart: Callable[[], BrokerSettings],
    count: int = 10,
    queue: str = DEMO_QUEUE,
    wait_timeout: float = 60.0,
) -> DurabilityResult:
    """Declare durable ``queue`` (purged), publish ``count`` persistent and ``count`` transient
    messages with confirms through the default exchange, call ``restart()`` (which restarts the
    broker and returns the settings to reach it afterwards), then count what is left by kind and
    delete the queue. Raises BrokerConnectionError if the broker is not back in ``wait_timeout``
    seconds."""
    with open_channel(settings) as channel:
        try:
            channel.queue_declare(queue, durable=True)
            channel.queue_purge(queue)
        except pe.AMQPError as e:
            raise translate(e, settings) from e
    with Publisher(settings) as publisher:
        for persistent in (True, False):
            for seq in range(count):
                kind = "persistent" if persistent else "transient"
                publisher.publish(
                    OutgoingMessage(
                        body=encode_json({"kind": kind, "seq": seq}),
                        message_id=f"durability-{kind}-{seq}-{time.time_ns()}",
                        exchange="",
                        routing_key=queue,
                        persistent=persistent,
                    )
                )
    after = restart()
    deadline = time.monotonic() + wait_timeout
    while True:
        try:
            survivors = _drain(after, queue)
            break
        except BrokerConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    return DurabilityResult(count, survivors.count("persistent"), survivors.count("transient"))


def _drain(settings: BrokerSettings, queue: str) -> list[str]:
    kinds: list[str] = []
    try:
        with open_channel(settings) as channel:
            while True:
                method, _, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                kinds.append(json.loads(body)["kind"])
            channel.queue_delete(queue)
    except pe.AMQPError as e:
        raise translate(e, settings) from e
    return kinds
