#!/usr/bin/env python3
"""Throughput with every safety on, against raw pika, in one run on the same broker.

Measures msg/s (median of --repeat runs) for: raw pika fire-and-forget publish, pika with a
confirm round trip per message, our pipelined publisher (confirms + mandatory + persistent +
message_id), raw auto-ack consume, and our consumer (manual ack in batches after the SQLite
dedup commit). Then publish->processed latency (p50 / p99) at a fixed rate, with the consumer in
another process, and peak RSS. Uses its own queue in EAI_AMQP_URL's vhost and deletes it.

The bench queue is declared like the work queue q:tasks is configured, its policy given as
declare arguments (a policy would need the management API): ``--queue-type classic`` (the
default), durable with the queue-mode of q:tasks' policy in topology/definitions.json
(lazy); ``--queue-type quorum``, ``x-queue-type: quorum`` with the dead-letter strategy,
overflow and delivery limit of the quorum topology's policy, and no ``x-queue-mode``, which a
quorum queue refuses (406 PRECONDITION_FAILED "invalid arg 'x-queue-mode'", seen on 4.3.6).
Every path starts on a freshly declared queue. Both consume paths read the same n messages
(our publisher's: message_id, content_type, timestamp), published the same way, and start once
the broker holds all of them.

EAI_AMQP_URL may list several nodes of one cluster (comma-separated): each repetition then
runs every path through one node (the first repetition through the first node, the next
through the next...), where it also declares the queue, so a quorum queue's leader is on the
node the clients use (queue_leader_locator client-local, RabbitMQ's default) and the ratios
of a repetition compare paths that took the same route.

    python benchmarks/bench.py [--messages 20000] [--repeat 5] [--queue-type quorum] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# isort: split
# Started by another Python than the repository's .venv, scripts/_cli re-executes this file with
# the venv's interpreter (as every script does), before any dependency is imported.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import _cli  # noqa: F401

# isort: split

import pika
from prometheus_client import CollectorRegistry

from amqp_lab.cli.common import EXIT_OK, add_gc_option, run, settings_from_env
from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.progress import Progress
from amqp_lab.connection import connect
from amqp_lab.consuming.consumer import Consumer, ConsumerConfig
from amqp_lab.consuming.observer import NO_OBSERVER, ConsumerObserver
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.exporters.metrics import ConsumerMetrics
from amqp_lab.gc_policy import tune_gc
from amqp_lab.message import OutgoingMessage
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import QUEUE_TYPES, Names, QueueType, load_topology, with_queue_type
from benchmarks.history import HISTORY, broker_version, load_history, print_comparison, record

# Each path gets a queue of its own (q:bench:<run>:<k>): deleting a quorum queue and declaring
# one of the same name at once raced on a 4.3.6 cluster (a follower's old Raft member was still
# terminating, "already_started"; a later declare closed the connection with 541 INTERNAL_ERROR)
QUEUE_PREFIX = "q:bench"
# the policy keys a quorum bench queue takes as declare arguments (x-<key>): what changes how a
# quorum queue stores and delivers (the DLX itself is left out: nothing is dead-lettered here)
QUORUM_POLICY_ARGUMENTS = ("dead-letter-strategy", "overflow", "delivery-limit")
# 3.x: "... but current is the value 'quorum' of type 'longstr'"; 4.x: "... current is 'quorum'"
_CURRENT_TYPE = re.compile(r"'x-queue-type'.* current is (?:the value )?'([\w-]+)'")
PATHS = (
    "raw_fire_and_forget",
    "raw_fire_and_forget_enqueued",
    "pika_sync_confirms",
    "our_publisher",
    "raw_auto_ack_consume",
    "our_consumer",
)
# ratio name -> (numerator path, denominator path); each also per repetition, for its range
RATIOS = {
    "publisher_vs_fire_and_forget": ("our_publisher", "raw_fire_and_forget"),
    "publisher_vs_enqueued": ("our_publisher", "raw_fire_and_forget_enqueued"),
    "publisher_vs_sync_confirms": ("our_publisher", "pika_sync_confirms"),
    "consumer_vs_auto_ack": ("our_consumer", "raw_auto_ack_consume"),
}
# our publisher / fire-and-forget: docs/benchmarks.md (classic), issue 13 (quorum)
PUBLISHER_TARGET = {"classic": 0.7, "quorum": 0.8}
# a valid lab task of 256 bytes, so our consumer decodes it as it would any task
BODY = b'{"kind":"ok","seq":0,"pad":"' + b"x" * 226 + b'"}'
assert len(BODY) == 256


def work_queue_mode() -> str:
    """The queue-mode the topology's policy gives q:tasks ("default" when it sets none)."""
    policy = load_topology().policy_for("q:tasks")
    return str(policy.definition_dict.get("queue-mode", "default")) if policy else "default"


def queue_arguments(queue_type: QueueType, mode: str | None) -> dict[str, Any]:
    """queue.declare arguments of the bench queue, configured like q:tasks in the topology of
    ``queue_type`` (amqp_lab.topology.with_queue_type): classic with x-queue-mode ``mode``
    (explicitly classic, even in a vhost whose default queue type is quorum); quorum with its
    declare arguments (``x-queue-type: quorum``) and, as ``x-`` arguments, the
    :data:`QUORUM_POLICY_ARGUMENTS` its policy sets (``mode`` must then be None)."""
    topology = with_queue_type(load_topology(), queue_type)
    arguments: dict[str, Any] = {
        "x-queue-type": "classic",
        **dict(topology.queue("q:tasks").arguments),
    }
    if queue_type == "classic":
        arguments["x-queue-mode"] = mode or "default"
        return arguments
    assert mode is None, "a quorum queue has no queue-mode"
    policy = topology.policy_for("q:tasks")
    definition = policy.definition_dict if policy else {}
    arguments.update({f"x-{k}": definition[k] for k in QUORUM_POLICY_ARGUMENTS if k in definition})
    return arguments


def bench_names(queue: str) -> Names:
    """The roles our consumer reads: the bench queue has no DLX or wait queues (the handler
    never fails)."""
    return Names(exchange="", routing_key=queue, queue=queue, dead_letter_exchange="", dlq="")


class BenchQueues:
    """The run's bench queues, one at a time: :meth:`fresh` deletes the current one and
    declares a new, empty, durable queue with ``arguments`` and a name of its own;
    :meth:`delete` removes the last one."""

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.arguments = arguments
        self.run = uuid.uuid4().hex[:8]
        self.count = 0
        self.current: str | None = None

    def fresh(self, settings: BrokerSettings) -> str:
        self.delete(settings)
        self.count += 1
        name = f"{QUEUE_PREFIX}:{self.run}:{self.count}"
        connection = connect(settings)
        connection.channel().queue_declare(name, durable=True, arguments=self.arguments)
        connection.close()
        self.current = name
        return name

    def delete(self, settings: BrokerSettings) -> None:
        if self.current is not None:
            connection = connect(settings)
            connection.channel().queue_delete(self.current)
            connection.close()
            self.current = None


def declared_type(settings: BrokerSettings, queue: str, arguments: dict[str, Any]) -> str:
    """The type of the existing bench ``queue`` as the broker holds it: queue.declare with its
    ``arguments`` but the other ``x-queue-type`` fails with 406 PRECONDITION_FAILED
    "inequivalent arg 'x-queue-type' ... current is '<type>'" (the broker compares the
    arguments before it validates them; a declare that succeeds changed nothing)."""
    other = "classic" if arguments["x-queue-type"] == "quorum" else "quorum"
    connection = connect(settings)
    try:
        probe = {**arguments, "x-queue-type": other}
        connection.channel().queue_declare(queue, durable=True, arguments=probe)
        return other
    except pika.exceptions.ChannelClosedByBroker as e:
        found = _CURRENT_TYPE.search(e.reply_text)
        return found.group(1) if e.reply_code == 406 and found else f"unknown ({e.reply_text})"
    finally:
        if connection.is_open:
            connection.close()


def entry_points(settings: BrokerSettings) -> list[BrokerSettings]:
    """One BrokerSettings per address of ``settings`` (a comma-separated list names the nodes
    of one cluster), so that every connection of a repetition goes through the same node."""
    return list(settings.addresses())


def wait_for_depth(settings: BrokerSettings, queue: str, n: int, timeout: float = 60) -> None:
    """Poll until ``queue`` holds ``n`` messages (fire-and-forget returns before the broker
    has them all); raises SystemExit after ``timeout`` seconds."""
    connection = connect(settings)
    try:
        _poll_depth(connection.channel(), queue, n, time.monotonic() + timeout)
    finally:
        connection.close()


def wait_for_consumer(settings: BrokerSettings, queue: str, timeout: float = 60) -> None:
    """Poll (passive queue.declare every 10 ms) until ``queue`` has a consumer; raises
    SystemExit after ``timeout`` seconds."""
    connection = connect(settings)
    channel = connection.channel()
    deadline = time.monotonic() + timeout
    try:
        while not channel.queue_declare(queue, passive=True).method.consumer_count:
            if time.monotonic() > deadline:
                raise SystemExit("the latency consumer did not subscribe in time")
            time.sleep(0.01)
    finally:
        connection.close()


def _poll_depth(channel: Any, queue: str, n: int, deadline: float) -> int:
    """Passive queue.declare every 10 ms until ``queue`` holds ``n`` messages; returns
    the depth read last; SystemExit once time.monotonic() passes ``deadline``."""
    while (depth := channel.queue_declare(queue, passive=True).method.message_count) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the bench queue did not reach {n} messages in time")
        time.sleep(0.01)
    return int(depth)


def raw_publish(settings: BrokerSettings, queue: str, n: int) -> tuple[float, float, int]:
    """Fire-and-forget: (msg/s until the client has written everything - the reference the
    targets use -, msg/s until all n are enqueued, the queue depth polled every 10 ms on a
    second connection, the depth then). Raises SystemExit if the queue does not reach n within
    120 s."""
    connection = connect(settings)
    channel = connection.channel()
    probe = connect(settings)
    probe_channel = probe.channel()
    props = pika.BasicProperties(delivery_mode=2)
    started = time.perf_counter()
    for _ in range(n):
        channel.basic_publish("", queue, BODY, props)
    connection.process_data_events(0)
    written = time.perf_counter() - started
    depth = _poll_depth(probe_channel, queue, n, time.monotonic() + 120)
    enqueued = time.perf_counter() - started
    connection.close()
    probe.close()
    return n / written, n / enqueued, depth


def sync_confirms(settings: BrokerSettings, queue: str, n: int) -> tuple[float, int]:
    """(msg/s, messages confirmed) publishing ``n`` with BlockingChannel's confirm round trip
    per message (mandatory; a nack or a return raises)."""
    connection = connect(settings)
    channel = connection.channel()
    channel.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    started = time.perf_counter()
    confirmed = 0
    for _ in range(n):
        channel.basic_publish("", queue, BODY, props, mandatory=True)
        confirmed += 1
    elapsed = time.perf_counter() - started
    connection.close()
    return n / elapsed, confirmed


def messages(queue: str, n: int, prefix: str) -> list[OutgoingMessage]:
    return [
        OutgoingMessage(
            body=BODY,
            message_id=f"{prefix}-{i}",
            exchange="",
            routing_key=queue,
            content_type="application/json",
        )
        for i in range(n)
    ]


def our_publish(settings: BrokerSettings, queue: str, n: int, window: int) -> tuple[float, int]:
    """(msg/s, messages confirmed) of PipelinedPublisher.publish_many on ``n`` messages, timed
    until the last outcome; SystemExit if any failed."""
    batch = messages(queue, n, f"p{time.time_ns()}")
    with PipelinedPublisher(settings, window=window) as publisher:
        # like the raw paths, connection set-up is outside the timing; every confirm is inside
        started = time.perf_counter()
        result = publisher.publish_many(batch).wait()
        elapsed = time.perf_counter() - started
    if result.failures:
        raise SystemExit(f"publisher: {len(result.failures)} failures: {result.failures[0][1]}")
    return n / elapsed, result.confirmed


def raw_consume(settings: BrokerSettings, queue: str, n: int) -> tuple[float, int]:
    """Auto-ack consume of ``n`` messages: (msg/s, messages received), timed from connect to
    close like :func:`our_consume` (whose Consumer.run() connects, subscribes, cancels and
    closes)."""
    started = time.perf_counter()
    connection = connect(settings)
    channel = connection.channel()
    count = 0
    for method, _, _ in channel.consume(queue, auto_ack=True, inactivity_timeout=5):
        if method is None:
            break
        count += 1
        if count == n:
            break
    channel.cancel()
    connection.close()
    return count / (time.perf_counter() - started), count


def noop(task: Any, db: Any) -> None:
    """The bench handler: the dedup claim is the only write."""


def consumer_config(
    queue: str, batch: int, n: int, concurrency: int, idle: float
) -> ConsumerConfig:
    """The bench consumer's settings: ``concurrency`` units of ``batch`` at once, prefetch
    3 * batch * concurrency, no topology check (the bench queue has no DLQ, and the broker may
    have no management API)."""
    return ConsumerConfig(
        bench_names(queue),
        prefetch=batch * 3 * concurrency,
        ack_batch=batch,
        max_messages=n,
        idle_exit=idle,
        concurrency=concurrency,
        verify_topology=False,
    )


def observer_for(metrics: bool) -> ConsumerObserver:
    """The Prometheus observer (``--metrics``: what a worker with --metrics-port pays per
    delivery) or none."""
    if not metrics:
        return NO_OBSERVER
    return ConsumerMetrics("bench", "bench", registry=CollectorRegistry())


def our_consume(
    settings: BrokerSettings, queue: str, n: int, args: argparse.Namespace, path: Path
) -> tuple[float, int]:
    """Our consumer on ``n`` messages (manual ack in batches after the SQLite dedup commit):
    (msg/s, messages handled), timed from connect to close: Consumer.run() includes both."""
    store = SqliteDedupStore(path)
    config = consumer_config(queue, args.batch, n, args.concurrency, 5)
    started = time.perf_counter()
    handled = Consumer(
        settings, noop, store, config, on_report=lambda r: None, observer=observer_for(args.metrics)
    ).run()
    elapsed = time.perf_counter() - started
    store.close()
    return handled / elapsed, handled


def latency(
    settings: BrokerSettings, queue: str, rate: int, seconds: float, args: argparse.Namespace
) -> dict[str, float]:
    """Publish to ``queue`` at ``rate`` msg/s with a send timestamp; a consumer process
    (the bench's consumer settings) reports latencies: one window."""
    n = int(rate * seconds)
    consumer = subprocess.Popen(
        [
            *(sys.executable, __file__, "--latency-consumer", str(n)),
            *("--batch", str(args.batch), "--latency-queue", queue),
            *("--concurrency", str(args.concurrency)),
            *("--gc-young-threshold", str(args.gc_young_threshold)),
            *(("--metrics",) if args.metrics else ()),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "EAI_AMQP_URL": settings.amqp_url},  # the node publishing here
    )
    wait_for_consumer(settings, queue)  # latency is measured from here, not from process start
    with PipelinedPublisher(settings, window=1000) as publisher:
        started = time.perf_counter()
        for i in range(n):
            due = started + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            publisher.publish_async(
                OutgoingMessage(
                    body=BODY,
                    message_id=f"lat-{time.time_ns()}-{i}",
                    exchange="",
                    routing_key=queue,
                    headers={"sent_ns": time.time_ns()},
                    content_type="application/json",
                )
            )
        publisher.flush()
    out, _ = consumer.communicate(timeout=120)
    return dict(json.loads(out.strip().splitlines()[-1]))


def latency_consumer(settings: BrokerSettings, queue: str, n: int, args: argparse.Namespace) -> int:
    samples: list[float] = []

    def handler(task: Any, db: Any) -> None:
        samples.append((time.time_ns() - task.headers["sent_ns"]) / 1e6)

    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteDedupStore(Path(tmp) / "lat.sqlite3")
        Consumer(
            settings,
            handler,
            store,
            consumer_config(queue, args.batch, n, args.concurrency, 10),
            on_report=lambda r: None,
            observer=observer_for(args.metrics),
        ).run()
    samples.sort()
    print(
        json.dumps(
            {
                "latency_p50_ms": round(statistics.median(samples), 2),
                "latency_p99_ms": round(samples[int(len(samples) * 0.99) - 1], 2),
                "latency_samples": len(samples),
            }
        )
    )
    return EXIT_OK


def repetition(
    settings: BrokerSettings,
    queues: BenchQueues,
    args: argparse.Namespace,
    db: Path,
    on_path: Callable[[str], None] = lambda path: None,
) -> tuple[dict[str, float], dict[str, int]]:
    """Every path once through ``settings``' node, each on a fresh queue: (msg/s by path,
    messages each path saw through: enqueued, confirmed, received or handled).
    ``on_path(name)`` before each path (the progress line)."""
    n = args.messages
    rates: dict[str, float] = {}
    counts: dict[str, int] = {}
    on_path("raw_fire_and_forget")
    queue = queues.fresh(settings)
    written, enqueued, counts["raw_fire_and_forget"] = raw_publish(settings, queue, n)
    rates["raw_fire_and_forget"], rates["raw_fire_and_forget_enqueued"] = written, enqueued
    on_path("pika_sync_confirms")
    queue = queues.fresh(settings)
    rates["pika_sync_confirms"], counts["pika_sync_confirms"] = sync_confirms(
        settings, queue, max(500, n // 10)
    )
    on_path("our_publisher")
    queue = queues.fresh(settings)
    rates["our_publisher"], counts["our_publisher"] = our_publish(settings, queue, n, args.window)
    wait_for_depth(settings, queue, n)
    on_path("our_consumer")
    rates["our_consumer"], counts["our_consumer"] = our_consume(settings, queue, n, args, db)
    # the auto-ack baseline consumes the same messages, published the same way
    on_path("raw_auto_ack_consume")
    queue = queues.fresh(settings)
    our_publish(settings, queue, n, args.window)
    wait_for_depth(settings, queue, n)
    rates["raw_auto_ack_consume"], counts["raw_auto_ack_consume"] = raw_consume(settings, queue, n)
    return rates, counts


def parse_args() -> argparse.Namespace:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--window", type=int, default=10000, help="unconfirmed in flight")
    parser.add_argument(
        "--batch", type=int, default=500, help="consumer ack batch (prefetch: 3 * batch)"
    )
    parser.add_argument("--rate", type=int, default=1000, help="latency test, msg/s")
    parser.add_argument("--seconds", type=float, default=4.0, help="one latency window, seconds")
    parser.add_argument(
        "--windows", type=int, default=5, help="latency windows (p50 and p99: their median)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="our consumer's handler threads (units)"
    )
    parser.add_argument(
        "--metrics", action="store_true", help="our consumer with the Prometheus observer"
    )
    parser.add_argument(
        "--history",
        type=Path,
        default=HISTORY,
        help=f"the record of measured runs (default {HISTORY.relative_to(HISTORY.parents[1])})",
    )
    parser.add_argument(
        "--no-record", dest="record", action="store_false", help="do not append this run"
    )
    parser.add_argument(
        "--compare", action="store_true", help="print the change against the last recorded run"
    )
    add_gc_option(parser)  # the worker's and relay's option, parsed the same way
    parser.add_argument("--queue-type", choices=QUEUE_TYPES, default="classic")
    parser.add_argument(
        "--queue-mode",
        choices=("lazy", "default"),
        default=None,
        help="classic only: the bench queue's x-queue-mode, which RabbitMQ 3.12+ ignores "
        "(default: what the topology's policy gives q:tasks)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--latency-consumer", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--latency-queue", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.messages, args.repeat, args.windows, args.concurrency) < 1:
        parser.error("--messages, --repeat, --windows and --concurrency must be at least 1")
    if args.queue_type == "quorum" and args.queue_mode is not None:
        parser.error(
            "--queue-mode is for classic queues: a quorum queue refuses x-queue-mode "
            "(406 PRECONDITION_FAILED)"
        )
    if args.queue_type == "classic" and args.queue_mode is None:
        args.queue_mode = work_queue_mode()
    return args


def main() -> int:
    args = parse_args()
    settings = settings_from_env("amqp-lab bench", heartbeat=60)
    # what the worker command does once started (amqp_lab.gc_policy), for every path alike
    tune_gc(args.gc_young_threshold)
    if args.latency_consumer is not None:
        return latency_consumer(settings, args.latency_queue, args.latency_consumer, args)
    entries = entry_points(settings)
    queues = BenchQueues(queue_arguments(args.queue_type, args.queue_mode))
    try:
        results, counts, queue_type, lat = measure(entries, queues, args)
    finally:
        queues.delete(entries[0])
    rss_mb = (
        max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        / 1024
    )
    median = {k: statistics.median(v) for k, v in results.items()}
    per_repetition = {
        name: [a / b for a, b in zip(results[num], results[den], strict=True)]
        for name, (num, den) in RATIOS.items()
    }
    summary: dict[str, Any] = {
        **{f"{k}_msg_s": round(v) for k, v in median.items()},
        **{f"{k}_msg_s_range": [round(min(v)), round(max(v))] for k, v in results.items()},
        # each ratio: the median of the per-repetition ratios (paths of one repetition ran
        # seconds apart on the same broker), with their range
        **{name: round(statistics.median(v), 3) for name, v in per_repetition.items()},
        **{f"{k}_range": [round(min(v), 3), round(max(v), 3)] for k, v in per_repetition.items()},
        **lat,
        "peak_rss_mb": round(rss_mb, 1),
        "messages": args.messages,
        "repeat": args.repeat,
        "counts": counts,
        "body_bytes": len(BODY),
        "queue_type": queue_type,
        "queue_arguments": queues.arguments,
        "nodes": len(entries),
        "window": args.window,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "metrics": args.metrics,
        "gc_young_threshold": args.gc_young_threshold,
        "broker_version": broker_version(entries[0]),
    }
    print_report(summary, median, args)
    history = load_history(args.history)
    if args.compare:
        print_comparison(summary, history)
    if args.record:
        record(args.history, summary)
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    return EXIT_OK


def measure(
    entries: list[BrokerSettings], queues: BenchQueues, args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, int], str, dict[str, float]]:
    """``--repeat`` repetitions, the i-th through node i modulo the number of nodes, then the
    latency test through the first: (msg/s by path per repetition, messages seen by path over
    all repetitions, the queue type the broker holds, latency figures). On a terminal a
    progress line on stderr says which repetition and path runs; in a pipe, nothing."""
    queue = queues.fresh(entries[0])
    queue_type = declared_type(entries[0], queue, queues.arguments)
    if queue_type != queues.arguments["x-queue-type"]:
        raise SystemExit(f"the bench queue was declared {queues.arguments} but is {queue_type}")
    results: dict[str, list[float]] = {k: [] for k in PATHS}
    counts = {k: 0 for k in PATHS if k != "raw_fire_and_forget_enqueued"}
    progress = Progress("bench", total=args.repeat, unit="repetitions")
    with tempfile.TemporaryDirectory() as tmp, progress:
        for r in range(args.repeat):
            entry = entries[r % len(entries)]
            where = f"repetition {r + 1} via {entry.host}:{entry.port}"

            def on_path(path: str, r: int = r, where: str = where) -> None:
                progress.update(r, f"{where}: {path}")

            rates, seen = repetition(entry, queues, args, Path(tmp) / f"dedup-{r}.sqlite3", on_path)
            for key, value in rates.items():
                results[key].append(value)
            for key, count in seen.items():
                counts[key] += count
        windows = []
        for w in range(args.windows):
            progress.update(
                args.repeat,
                f"latency at {args.rate} msg/s, window {w + 1}/{args.windows}",
            )
            queue = queues.fresh(entries[0])
            windows.append(latency(entries[0], queue, args.rate, args.seconds, args))
    return results, counts, queue_type, latency_summary(windows)


def latency_summary(windows: list[dict[str, float]]) -> dict[str, Any]:
    """p50 and p99 as the median over the latency windows, each with its min and max: one
    stall in one window does not decide the figure."""
    out: dict[str, Any] = {"latency_windows": len(windows)}
    for key in ("latency_p50_ms", "latency_p99_ms"):
        values = [w[key] for w in windows]
        out[key] = round(statistics.median(values), 2)
        out[f"{key}_range"] = [round(min(values), 2), round(max(values), 2)]
        out[f"{key}_windows"] = [round(v, 2) for v in values]  # in the order they ran
    out["latency_samples"] = sum(int(w["latency_samples"]) for w in windows)
    return out


def print_report(
    summary: dict[str, Any], median: dict[str, float], args: argparse.Namespace
) -> None:
    """The human-readable table: median and range per path, then the ratios with targets."""
    where = f"{summary['nodes']} node(s)" if summary["nodes"] > 1 else "1 node"
    print(
        f"{args.messages} persistent messages of {len(BODY)} bytes, {summary['queue_type']} queue "
        f"{summary['queue_arguments']}, {where}"
    )
    print(f"{'path':32} {'msg/s (median of ' + str(args.repeat) + ')':>22}   range")
    for key, value in median.items():
        low, high = summary[f"{key}_msg_s_range"]
        print(f"{key:32} {value:>22,.0f}   {low:,}-{high:,}")

    def ratio(name: str, label: str, note: str) -> None:
        low, high = summary[f"{name}_range"]
        print(f"{label:28} {summary[name]:>8} ({low}-{high} per repetition) {note}")

    target = PUBLISHER_TARGET[summary["queue_type"]]
    ratio("publisher_vs_fire_and_forget", "publisher / fire-and-forget", f"(target >= {target})")
    ratio(
        "publisher_vs_enqueued",
        "publisher / f&f enqueued",
        "(no target: fire-and-forget timed until every message is enqueued)",
    )
    ratio("publisher_vs_sync_confirms", "publisher / sync confirms", "(target >= 8)")
    ratio("consumer_vs_auto_ack", "consumer / auto-ack", "(target >= 0.6)")
    p50, p99 = summary["latency_p50_ms_range"], summary["latency_p99_ms_range"]
    print(
        f"latency at {args.rate} msg/s, median of {summary['latency_windows']} windows: "
        f"p50 {summary['latency_p50_ms']} ms ({p50[0]}-{p50[1]}), p99 "
        f"{summary['latency_p99_ms']} ms ({p99[0]}-{p99[1]}) (target p99 < 10)"
    )
    print(f"peak RSS {summary['peak_rss_mb']} MB")


if __name__ == "__main__":
    run(main)
