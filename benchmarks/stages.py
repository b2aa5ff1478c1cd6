#!/usr/bin/env python3
"""CPU per delivery, stage by stage, on the consumer's path (no broker: each stage is timed
on its own, in this process, over the same deliveries the bench consumes).

The stages are those of docs/benchmarks.md's table:

* ``frame parse``: pika turning the three frames of a delivery (basic.deliver, content header,
  body) into a method, properties and a body - the header's property table excluded;
* ``header decode``: the lossless codec (:mod:`amqp_lab.wire`) decoding the content header;
* ``task build``: :func:`amqp_lab.consuming.delivery.prepare` (the Delivery, the JSON body,
  the Task);
* ``dedup claim``: the SQLite store's ``process_batch`` for a batch of first deliveries (one
  transaction, one multi-row claim insert, one fsync), per delivery; and, apart from the total
  (a first delivery never pays it), ``redelivery count``: ``note_return`` of one redelivered
  delivery (one transaction);
* ``handler runner``: what the handler thread adds around the claim for each delivery
  (:class:`~amqp_lab.consuming.handling.HandlerRunner`: the handler called under its contract,
  timed and watched, in its savepoint) - ``process`` of every unit on a fresh store, less the
  ``dedup claim`` stage;
* ``hand-off``: giving a unit to a handler thread and waking the I/O thread, per delivery;
* ``settlement``: :class:`amqp_lab.consuming.settling.Settler` deciding and acking a batch
  (one basic.ack multiple on a channel that only counts), per delivery;
* ``spans and observers``: a process span started and ended (no OpenTelemetry SDK) and the
  observer told, per delivery; with ``--metrics``, the Prometheus observer;
* ``report line``: the delivery's report as the worker's text line.

Apart from the total, ``frame loop, pika's`` and ``frame loop, ours``: the byte stream of the
deliveries read 4 KiB at a time (as pika's socket reads are) through pika 1.4.4's
``Connection._on_data_available`` and through :mod:`amqp_lab.frame_reader`'s, on a stand-in
connection whose channel dispatch does nothing: frame parse and header decode included, and
what each loop adds around them (buffer trims, the callback lookup per method frame).

    python benchmarks/stages.py [--deliveries 20000] [--batch 500] [--repeat 5] [--json]

Each figure is the median over ``--repeat`` runs of the stage's CPU time (process time) per
delivery, in microseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# isort: split
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import _cli  # noqa: F401

# isort: split

import pika.frame
import pika.spec
from pika.callback import CallbackManager
from pika.connection import Connection
from prometheus_client import CollectorRegistry

from amqp_lab import frame_reader
from amqp_lab.cli.common import EXIT_OK, run
from amqp_lab.cli.parser import CommandParser
from amqp_lab.consuming.config import ConsumerConfig
from amqp_lab.consuming.delivery import Delivery, prepare
from amqp_lab.consuming.engine import ConsumerEngine, EngineConfig
from amqp_lab.consuming.handling import HandlerRunner
from amqp_lab.consuming.observer import NO_OBSERVER, ConsumerObserver
from amqp_lab.consuming.settling import Settler
from amqp_lab.consuming.store_retry import StoreRetry
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.exporters.metrics import ConsumerMetrics
from amqp_lab.message import OutgoingMessage
from amqp_lab.observability.tracing import end_process_span, start_process_span
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import Names
from amqp_lab.wire import AmqpProperties

BODY = b'{"kind":"ok","seq":1,"pad":"' + b"x" * 220 + b'"}'  # 256 bytes, as the bench's
NAMES = Names(exchange="", routing_key="q", queue="q", dead_letter_exchange="", dlq="")


def frames(n: int) -> list[tuple[bytes, bytes, bytes]]:
    """The three frames of ``n`` deliveries as the broker writes them (our publisher's
    properties: message_id, content_type, timestamp, persistent, an ``attempts`` header)."""
    out = []
    for i in range(n):
        message = OutgoingMessage(body=BODY, message_id=f"m-{i}", routing_key="q")
        props = message.sealed_properties()
        deliver = pika.spec.Basic.Deliver("ctag", i + 1, False, "", "q")
        method = pika.frame.Method(1, deliver).marshal()
        header = pika.frame.Header(1, len(BODY), props).marshal()
        body = pika.frame.Body(1, BODY).marshal()
        out.append((method, header, body))
    return out


class CountingChannel:
    """A channel that only counts what it is asked to settle."""

    is_open = True

    def __init__(self) -> None:
        self.acks = 0

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self.acks += 1


class FrameSink:
    """What pika's frame loop touches of a Connection, made of pika's own methods; frames for a
    channel go nowhere."""

    _on_data_available = Connection._on_data_available
    _read_frame = Connection._read_frame
    _trim_frame_buffer = Connection._trim_frame_buffer
    _process_frame = Connection._process_frame
    _process_callbacks = Connection._process_callbacks
    _is_method_frame = Connection._is_method_frame
    _has_pending_callbacks = Connection._has_pending_callbacks

    def __init__(self) -> None:
        self._frame_buffer = b""
        self.bytes_received = self.frames_received = 0
        self.callbacks = CallbackManager()

    def _deliver_frame_to_channel(self, value: object) -> None:
        pass


def frame_loop(stream: bytes, ours: bool) -> Callable[[], object]:
    """Feed ``stream`` in reads of 4 KiB through pika's frame loop or ours."""
    reads = [stream[i : i + 4096] for i in range(0, len(stream), 4096)]

    def work() -> None:
        sink = FrameSink()
        if ours:
            frame_reader.install(sink)
        for data in reads:
            sink._on_data_available(data)

    return work


def cpu(work: Callable[[], object]) -> float:
    """Process CPU seconds ``work`` took."""
    started = time.process_time()
    work()
    return time.process_time() - started


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Microseconds of CPU per delivery, by stage, for one run."""
    n, batch = args.deliveries, args.batch
    raw = frames(n)
    us: dict[str, float] = {}

    def parse_frames() -> None:
        for method, _, body in raw:
            pika.frame.decode_frame(method)
            pika.frame.decode_frame(body)

    us["frame parse"] = cpu(parse_frames)
    decoded = [pika.frame.decode_frame(h)[1] for _, h, _ in raw]
    header_bytes = [h[7 + 12 : -1] for _, h, _ in raw]  # frame head, class/weight/size, end

    def decode_headers() -> None:
        for encoded in header_bytes:
            AmqpProperties().decode(encoded)

    us["header decode"] = cpu(decode_headers)
    props = [f.properties for f in decoded]
    methods = [pika.frame.decode_frame(m)[1].method for m, _, _ in raw]
    deliveries: list[Delivery] = []
    us["task build"] = cpu(
        lambda: deliveries.extend(
            prepare(m, p, BODY, time.time(), 1 << 20) for m, p in zip(methods, props, strict=True)
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteDedupStore(Path(tmp) / "d.sqlite3")

        def claims() -> None:
            for i in range(0, n, batch):
                store.process_batch([(d.message_id or "", noop) for d in deliveries[i : i + batch]])

        us["dedup claim"] = cpu(claims)
        redelivered = deliveries[: min(n, 2000)]
        per_redelivery = cpu(
            lambda: [store.note_return(f"r-{d.message_id}", d.now) for d in redelivered]
        ) / len(redelivered)
        store.close()
    units = [deliveries[i : i + batch] for i in range(0, n, batch)]
    with tempfile.TemporaryDirectory() as tmp:  # a fresh store: first deliveries again
        fresh = SqliteDedupStore(Path(tmp) / "d.sqlite3")
        config = ConsumerConfig(NAMES, prefetch=3 * batch, ack_batch=batch, verify_topology=False)
        runner = HandlerRunner(noop_handler, fresh, config, StoreRetry(30.0))

        def run_units() -> None:
            for unit in units:
                runner.process(unit)

        whole = cpu(run_units)
        us["handler runner"] = max(0.0, whole - us["dedup claim"])
        fresh.close()
    with ThreadPoolExecutor(1) as pool:
        us["hand-off"] = cpu(lambda: [pool.submit(len, unit).result() for unit in units])
    observer: ConsumerObserver = NO_OBSERVER
    if args.metrics:
        observer = ConsumerMetrics("/", "q", registry=CollectorRegistry())
    engine = ConsumerEngine(
        BrokerSettings("amqp://guest:guest@127.0.0.1/%2F"),
        store,
        EngineConfig(dlx="", expectations=config.retry_expectations("/"), verify_topology=False),
        observer,
    )
    settler = Settler(config, engine, observer=observer)
    channel = CountingChannel()

    def settle() -> None:
        for unit in units:
            settler.settle_batch(None, channel, unit, [])

    us["settlement"] = cpu(settle)

    def spans_and_observers() -> None:
        for d in deliveries:
            span = start_process_span(
                "q",
                d.headers,
                message_id=d.message_id,
                exchange="",
                routing_key="q",
                delivery_tag=d.delivery_tag,
                attempt=d.attempt,
            )
            end_process_span(span, "processed", None)
            observer.unacked(1)

    us["spans and observers"] = cpu(spans_and_observers)
    reports = [d.report("processed", 1) for d in deliveries]
    us["report line"] = cpu(lambda: [r.line() for r in reports])
    table = {stage: round(seconds / n * 1e6, 2) for stage, seconds in us.items()}
    table["total"] = round(sum(table.values()), 2)
    stream = b"".join(b"".join(delivery) for delivery in raw)
    for name, ours in (("frame loop, pika's", False), ("frame loop, ours", True)):
        table[name] = round(cpu(frame_loop(stream, ours)) / n * 1e6, 2)
    # not on a first delivery's path: one transaction per redelivered delivery
    table["redelivery count (per redelivery)"] = round(per_redelivery * 1e6, 2)
    return table


def noop(db: Any) -> None:
    """The bench handler: the claim is the only write."""


def noop_handler(task: Any, db: Any) -> None:
    """The bench handler as the consumer calls it (task, db)."""


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--metrics", action="store_true", help="the Prometheus observer")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = [measure(args) for _ in range(args.repeat)]
    table = {stage: statistics.median(r[stage] for r in runs) for stage in runs[0]}
    if args.json:
        print(json.dumps({"us_per_delivery": table, "repeat": args.repeat}, allow_nan=False))
    else:
        print(f"CPU per delivery, median of {args.repeat} runs of {args.deliveries} (µs)")
        for stage, value in table.items():
            print(f"  {stage:<22} {value:8.2f}")
    return EXIT_OK


if __name__ == "__main__":
    run(main)
