"""Designs 4-7 on RabbitMQ (pika, amqp_lab): a classic queue consumed with auto-ack, the same
with manual acks after the effect, the library's :class:`~amqp_lab.consuming.Consumer` with the
SQLite dedup store (effect and message_id claim in one transaction), and a stream queue read
from a stored offset.

https://www.rabbitmq.com/docs/confirms#acknowledgement-modes,
https://www.rabbitmq.com/docs/streams#consuming
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqp_lab.connection import close_quietly, connect, open_channel
from amqp_lab.consuming import Consumer, ConsumerConfig
from amqp_lab.dedup import open_store
from amqp_lab.management import ManagementClient
from amqp_lab.message import OutgoingMessage, Task, message_for
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology
from lab.loss_lab import effects

if TYPE_CHECKING:
    from lab.loss_lab.worker import WorkerContext

QUEUES = {"autoack": "loss.autoack", "manual": "loss.manual", "stream": "loss.stream"}
NAMES = load_topology().names
OFFSET_NAME = "stream"


def queue_for(design: str) -> str:
    return NAMES.queue if design == "dedup" else QUEUES[design]


def body(message_id: str, body_bytes: int) -> bytes:
    head = message_id.encode() + b"|"
    return head + b"x" * max(0, body_bytes - len(head))


class RabbitDesign:
    """The runner's side of one RabbitMQ design in ``settings``' vhost: declare, publish with
    confirms, what is left, memory per message kept (management API), cleanup."""

    def __init__(self, key: str, settings: BrokerSettings, effects_path: Path) -> None:
        self.key, self.settings, self.effects_path = key, settings, effects_path
        self.queue = queue_for(key)
        self.total = 0

    def _declare(self, queue: str) -> None:
        with open_channel(self.settings) as channel:
            if queue.endswith("stream"):
                arguments = {"x-queue-type": "stream"}
                channel.queue_declare(queue, durable=True, arguments=arguments)
            else:
                channel.queue_declare(queue, durable=True)

    def _publish(self, queue: str, ids: list[str], body_bytes: int) -> None:
        if queue == NAMES.queue:
            messages = [
                message_for(NAMES, body(i, body_bytes), message_id=i, content_type="text/plain")
                for i in ids
            ]
        else:
            messages = [
                OutgoingMessage(body(i, body_bytes), i, "", queue, "text/plain") for i in ids
            ]
        with PipelinedPublisher(self.settings, window=500) as publisher:
            batch = publisher.publish_many(messages).wait(300)
        if batch.failures:
            raise RuntimeError(f"{len(batch.failures)} publishes to {queue} failed")

    def setup(self) -> None:
        if self.key == "dedup":
            apply_topology(self.settings, load_topology())
        else:
            self._declare(self.queue)

    def load(self, ids: list[str], body_bytes: int) -> None:
        """Publish every id, persistent, with confirms (PipelinedPublisher)."""
        self.total = len(ids)
        self._publish(self.queue, ids, body_bytes)

    def remaining(self) -> int:
        """Ready messages (queue.declare passive), or for the stream the entries after the
        stored offset."""
        if self.key == "stream":
            db = effects.connect(self.effects_path)
            try:
                stored = effects.stored_offset(db, OFFSET_NAME)
            finally:
                db.close()
            return self.total - (0 if stored is None else stored + 1)
        with open_channel(self.settings) as channel:
            return int(channel.queue_declare(self.queue, passive=True).method.message_count)

    def start_helpers(self) -> None:
        """Nothing runs beside the worker: the broker redelivers by itself."""

    def stop_helpers(self) -> None:
        """Nothing to stop."""

    def memory(self, count: int, body_bytes: int) -> tuple[int, int, int]:
        """Publish ``count`` messages to a fresh queue of the design's type, poll the management
        API until it reports them all, and return (``memory``, ``message_bytes``, count), bytes;
        the queue is deleted afterwards."""
        queue = "loss.memory." + ("stream" if self.key == "stream" else "classic")
        self._declare(queue)
        try:
            self._publish(queue, [f"mem-{i:07d}" for i in range(count)], body_bytes)
            info = _settled(self.settings, queue, count)
            return int(info.get("memory") or 0), int(info.get("message_bytes") or 0), count
        finally:
            with open_channel(self.settings) as channel:
                channel.queue_delete(queue)

    def cleanup(self) -> None:
        """The vhost is the runner's to delete; nothing else here."""


def _settled(settings: BrokerSettings, queue: str, count: int, timeout: float = 60) -> Any:
    """The management API's queue object once its ``messages`` is ``count`` (statistics lag
    by collect_statistics_interval), or the last one seen after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with ManagementClient(settings) as api:
        while True:
            info = api.queue(settings.vhost, queue) or {}
            if info.get("messages") == count and "memory" in info:
                return info
            if time.monotonic() > deadline:
                return info
            time.sleep(0.5)


def work(design: str, ctx: WorkerContext) -> None:
    """The worker loop of a RabbitMQ design (see the module doc)."""
    settings = BrokerSettings(ctx.option("amqp_url"), ctx.options.get("management_url"))  # type: ignore[arg-type]
    prefetch = int(ctx.option("prefetch"))
    if design == "dedup":
        _dedup_loop(settings, ctx, prefetch)
        return
    connection = connect(settings)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        arguments = None
        if design == "stream":
            stored = effects.stored_offset(ctx.db, OFFSET_NAME)
            arguments = {"x-stream-offset": "first" if stored is None else stored + 1}
        every = int(ctx.option("offset_every"))
        last: int | None = None
        unstored = 0
        idle = time.monotonic()
        consume = channel.consume(
            QUEUES[design],
            auto_ack=design == "autoack",
            inactivity_timeout=0.25,
            arguments=arguments,
        )
        for method, props, _body in consume:
            if method is None:
                if last is not None and unstored:
                    effects.store_offset(ctx.db, OFFSET_NAME, last)
                    unstored = 0
                if ctx.should_stop(idle):
                    break
                continue
            ctx.process(str(props.message_id))
            if design == "stream":
                last, unstored = int(props.headers["x-stream-offset"]), unstored + 1
                if unstored >= every:
                    effects.store_offset(ctx.db, OFFSET_NAME, last)
                    unstored = 0
            if design != "autoack":
                channel.basic_ack(method.delivery_tag)
            idle = time.monotonic()
    finally:
        close_quietly(connection)


def _dedup_loop(settings: BrokerSettings, ctx: WorkerContext, prefetch: int) -> None:
    """The library's Consumer: the effect runs in the dedup transaction (same SQLite file)."""
    store = open_store(ctx.option("effects"))

    def handler(task: Task, db: Any) -> None:
        ctx.hold(True)
        time.sleep(ctx.rng.uniform(*ctx.work))
        db.execute("INSERT INTO effects (id, at) VALUES (?, ?)", (task.message_id, time.time()))
        ctx.hold(False)

    config = ConsumerConfig(
        NAMES, prefetch=prefetch, idle_exit=1.0, reconnect_attempts=30, max_redeliveries=1000
    )
    try:
        while True:
            Consumer(settings, handler, store, config).run()
            if (ctx.workdir / "stop").exists():
                return
    finally:
        store.close()
