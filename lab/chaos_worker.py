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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import close_quietly, connect
from amqp_lab.consuming.consumer import Consumer, ConsumerConfig, DeliveryReport
from amqp_lab.dedup import ManagedDedupStore, open_store
from amqp_lab.errors import BrokerConnectionError
from amqp_lab.message import Task
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import load_topology
from lab.chaos import ledger_handler

NAMES = load_topology().names
QUEUE = NAMES.queue
IDLE_EXIT = 1.0  # seconds without a delivery before checking the stop file


def report(r: DeliveryReport) -> None:
    print(json.dumps(r.as_dict()), flush=True)  # read back by lab.chaos.OutputTally


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
            done = store.process_once(task.message_id, functools.partial(handler, task))
            outcome = "processed" if done else "duplicate"
            report(DeliveryReport(task.message_id, outcome, 1, task.redelivered))
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
    prefetch: int = 10,
    ack_batch: int = 1,
) -> int:
    """Consume until idle with the stop file present; return the exit code (0). With
    ``ack_batch`` > 1 the store's process_batch covers each batch (prefetch: 2 * ack_batch)."""
    store = open_store(dedup_url)
    handler = ledger_handler(run_id, name, work_seconds)
    config = ConsumerConfig(
        NAMES,
        prefetch=max(prefetch, 2 * ack_batch),
        ack_batch=ack_batch,
        idle_exit=IDLE_EXIT,
        reconnect_attempts=30,
    )
    try:
        while True:
            if unsafe_auto_ack:
                consume_auto_ack(settings, store, handler)
            else:
                Consumer(settings, handler, store, config, on_report=report).run()
            if stop_file.exists():
                return 0
    finally:
        store.close()
