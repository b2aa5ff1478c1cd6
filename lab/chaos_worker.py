"""The crash test's worker process: started (and SIGKILLed) by scripts/chaos.py, not by hand.

Safe mode runs the library's manual-ack :class:`~amqp_lab.consumer.Consumer` with the ledger
handler. ``--unsafe-auto-ack`` consumes with ``auto_ack=True`` instead, the design the README
warns about: the broker forgets each message the moment it sends it, so whatever a worker has
received but not yet committed dies with it. Both print one outcome line per delivery and run
until they have been idle for a second after the stop file appeared.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import close_quietly, connect
from amqp_lab.consuming.consumer import Consumer, ConsumerConfig, DeliveryReport
from amqp_lab.dedup import ManagedDedupStore, Returned, open_store
from amqp_lab.errors import BrokerConnectionError
from amqp_lab.message import Task
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import load_topology
from lab.chaos import ledger_handler

NAMES = load_topology().names
QUEUE = NAMES.queue
IDLE_EXIT = 1.0  # seconds without a delivery before checking the stop file


def report(r: DeliveryReport, started: float | None = None) -> None:
    """One output line: the report, ``at`` (now) and ``started`` (when the worker began the
    delivery's dedup transaction), epoch seconds; read back by lab.chaos.OutputTally."""
    print(json.dumps(r.as_dict() | {"at": time.time(), "started": started}), flush=True)


class TimedStore:
    """A dedup store noting in ``started`` when the worker began each delivery's dedup
    transaction (epoch seconds, by message_id): right after the delivery reached it, before
    any wait for the store's lock - the worker's view of when the broker delivered it. Every
    call goes to ``store``."""

    def __init__(self, store: ManagedDedupStore, started: dict[str, float]) -> None:
        self.store, self.started = store, started

    def process_once(self, message_id: str, work: Callable[[Any], None]) -> bool:
        self.started[message_id] = time.time()
        return self.store.process_once(message_id, work)

    def process_batch(
        self, batch: list[tuple[str, Callable[[Any], None]]]
    ) -> list[bool | BaseException]:
        now = time.time()
        self.started.update((message_id, now) for message_id, _ in batch)
        return self.store.process_batch(batch)

    def first_seen(self, message_id: str, now: float) -> float:
        return self.store.first_seen(message_id, now)

    def note_redelivery(self, message_id: str, now: float) -> int:
        return self.store.note_redelivery(message_id, now)

    def reset_redeliveries(self, message_id: str) -> None:
        self.store.reset_redeliveries(message_id)

    def note_return(self, message_id: str, now: float) -> Returned:
        return self.store.note_return(message_id, now)

    def note_failure(self, message_id: str, now: float, failures: int | None) -> float:
        return self.store.note_failure(message_id, now, failures)

    def is_processed(self, message_id: str) -> bool:
        return self.store.is_processed(message_id)

    def close(self) -> None:
        self.store.close()


def consume_auto_ack(
    settings: BrokerSettings,
    store: ManagedDedupStore,
    handler: Callable[[Task, Any], None],
    idle_exit: float = IDLE_EXIT,
) -> None:
    """UNSAFE on purpose: basic.consume with auto_ack=True (no basic.qos limit applies), then the
    same dedup + handler transaction as the safe consumer. Returns after ``idle_exit`` seconds
    without a delivery, or when the connection is lost (messages it held are gone)."""
    try:
        connection = connect(settings)
    except BrokerConnectionError as e:
        print(f"auto-ack worker cannot connect: {e}", file=sys.stderr, flush=True)
        time.sleep(0.5)
        return
    try:
        channel = connection.channel()
        last = time.monotonic()
        for method, props, _body in channel.consume(QUEUE, auto_ack=True, inactivity_timeout=0.25):
            if method is None:
                if time.monotonic() - last >= idle_exit:
                    break
                continue
            last = time.monotonic()
            task = Task(
                message_id=props.message_id,
                body={},
                headers=dict(props.headers or {}),
                exchange=method.exchange,
                routing_key=method.routing_key,
                redelivered=bool(method.redelivered),
                attempt=1,
            )
            started = time.time()
            done = store.process_once(task.message_id, functools.partial(handler, task))
            outcome = "processed" if done else "duplicate"
            report(DeliveryReport(task.message_id, outcome, 1, task.redelivered), started)
        channel.cancel()
    except (pe.AMQPError, OSError) as e:
        print(f"auto-ack worker lost its connection: {e!r}", file=sys.stderr, flush=True)
    finally:
        close_quietly(connection)


def run_worker(
    settings: BrokerSettings,
    dedup_url: str,
    run_id: str,
    name: str,
    stop_file: Path,
    unsafe_auto_ack: bool = False,
    work_seconds: float = 0.0,
    prefetch: int | None = None,
    ack_batch: int = 1,
    stay: bool = False,
) -> int:
    """Consume until idle with the stop file present; return the exit code (0). With
    ``ack_batch`` > 1 the store's process_batch covers each batch. ``prefetch`` (basic.qos):
    by default the larger of 10 and 2 * ack_batch. Each report line carries the time the
    delivery's dedup transaction began (:class:`TimedStore`, for lab.failover).

    By default the consumer leaves after a second without a delivery and reconnects (to a node
    of the list, from a random start) until the stop file appears. With ``stay`` it keeps its
    connection while idle, as scripts/worker.py does, so that a worker on the minority side of
    a partition stays there (lab.chaos_partition); :func:`stop_when_drained` ends it."""
    store = open_store(dedup_url)
    started: dict[str, float] = {}
    timed = TimedStore(store, started)
    handler = ledger_handler(run_id, name, work_seconds)

    def on_report(r: DeliveryReport) -> None:
        report(r, started.pop(r.message_id, None) if r.message_id else None)

    config = ConsumerConfig(
        NAMES,
        prefetch=max(10, 2 * ack_batch) if prefetch is None else prefetch,
        ack_batch=ack_batch,
        idle_exit=None if stay else IDLE_EXIT,
        reconnect_attempts=30,
    )
    try:
        while True:
            if unsafe_auto_ack:
                consume_auto_ack(settings, store, handler)
            elif stay:
                consumer = Consumer(settings, handler, timed, config, on_report=on_report)
                done = threading.Event()
                watch = (consumer, stop_file, done)
                threading.Thread(target=stop_when_drained, args=watch, daemon=True).start()
                try:
                    consumer.run()
                finally:
                    done.set()
            else:
                Consumer(settings, handler, timed, config, on_report=on_report).run()
            if stop_file.exists():
                return 0
    finally:
        store.close()


def stop_when_drained(
    consumer: Consumer, stop_file: Path, done: threading.Event, idle: float = IDLE_EXIT
) -> None:
    """Stop ``consumer`` once ``stop_file`` exists and it has handled nothing for ``idle``
    seconds (the default consumer's idle exit, for a consumer that has none); return early
    when ``done`` is set (the consumer ended by itself)."""
    last, since = -1, time.monotonic()
    while not done.wait(0.2):
        if consumer.handled != last:
            last, since = consumer.handled, time.monotonic()
        elif stop_file.exists() and time.monotonic() - since >= idle:
            consumer.stop("the crash test is draining")
            return
