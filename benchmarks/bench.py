#!/usr/bin/env python3
"""Throughput with every safety on, against raw pika, in one run on the same broker.

Measures msg/s (median of --repeat runs) for: raw pika fire-and-forget publish, pika with a
confirm round trip per message, our pipelined publisher (confirms + mandatory + persistent +
message_id), raw auto-ack consume, and our consumer (manual ack in batches after the SQLite
dedup commit). Then publish->processed latency (p50 / p99) at a fixed rate, with the consumer in
another process, and peak RSS. Uses its own queue in EAI_AMQP_URL's vhost and deletes it.

The bench queue is declared like the work queue q:tasks is configured: durable, with the
queue-mode its policy in amqp_lab/topology/definitions.json sets (lazy; the policy itself would
need the management API). Every path starts on a freshly declared queue. Both consume paths
read the same n messages (our publisher's: message_id, content_type, timestamp), published the
same way, and start once the broker holds all of them.

    python benchmarks/bench.py [--messages 20000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# isort: split
# Started by another Python than the repository's .venv, scripts/_cli re-executes this file with
# the venv's interpreter (as every script does), before any dependency is imported.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import _cli  # noqa: F401

# isort: split

import pika

from amqp_lab.cli.common import EXIT_OK, run, settings_from_env
from amqp_lab.connection import connect
from amqp_lab.consuming.consumer import Consumer, ConsumerConfig
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.message import OutgoingMessage
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import Names, load_topology

QUEUE = "q:bench"
# The bench queue has no DLX or wait queues: the handler never fails.
BENCH_NAMES = Names(exchange="", routing_key=QUEUE, queue=QUEUE, dead_letter_exchange="", dlq="")
# a valid lab task of 256 bytes, so our consumer decodes it as it would any task
BODY = b'{"kind":"ok","seq":0,"pad":"' + b"x" * 226 + b'"}'
assert len(BODY) == 256


def work_queue_mode() -> str:
    """The queue-mode the topology's policy gives q:tasks ("default" when it sets none)."""
    policy = load_topology().policy_for("q:tasks")
    return str(policy.definition_dict.get("queue-mode", "default")) if policy else "default"


def fresh_queue(settings: BrokerSettings, mode: str) -> None:
    """Delete the bench queue and declare it again, empty, with x-queue-mode ``mode`` (this also
    replaces a queue an earlier run declared with other arguments)."""
    connection = connect(settings)
    channel = connection.channel()
    channel.queue_delete(QUEUE)
    # classic like q:tasks, even in a vhost whose default queue type is quorum (4.x)
    channel.queue_declare(
        QUEUE, durable=True, arguments={"x-queue-type": "classic", "x-queue-mode": mode}
    )
    connection.close()


def wait_for_depth(settings: BrokerSettings, n: int, timeout: float = 60) -> None:
    """Poll until the bench queue holds ``n`` messages (fire-and-forget returns before the broker
    has them all); raises SystemExit after ``timeout`` seconds."""
    connection = connect(settings)
    try:
        _poll_depth(connection.channel(), n, time.monotonic() + timeout)
    finally:
        connection.close()


def wait_for_consumer(settings: BrokerSettings, timeout: float = 60) -> None:
    """Poll (passive queue.declare every 10 ms) until the bench queue has a consumer; raises
    SystemExit after ``timeout`` seconds."""
    connection = connect(settings)
    channel = connection.channel()
    deadline = time.monotonic() + timeout
    try:
        while not channel.queue_declare(QUEUE, passive=True).method.consumer_count:
            if time.monotonic() > deadline:
                raise SystemExit("the latency consumer did not subscribe in time")
            time.sleep(0.01)
    finally:
        connection.close()


def _poll_depth(channel: Any, n: int, deadline: float) -> None:
    """Passive queue.declare every 10 ms until the bench queue holds ``n`` messages; SystemExit
    once time.monotonic() passes ``deadline``."""
    while channel.queue_declare(QUEUE, passive=True).method.message_count < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the bench queue did not reach {n} messages in time")
        time.sleep(0.01)


def raw_publish(settings: BrokerSettings, n: int) -> tuple[float, float]:
    """Fire-and-forget: (msg/s until the client has written everything - the reference the
    targets use -, msg/s until all n are enqueued, the queue depth polled every 10 ms on a
    second connection). Raises SystemExit if the queue does not reach n within 120 s."""
    connection = connect(settings)
    channel = connection.channel()
    probe = connect(settings)
    probe_channel = probe.channel()
    props = pika.BasicProperties(delivery_mode=2)
    started = time.perf_counter()
    for _ in range(n):
        channel.basic_publish("", QUEUE, BODY, props)
    connection.process_data_events(0)
    written = time.perf_counter() - started
    _poll_depth(probe_channel, n, time.monotonic() + 120)
    enqueued = time.perf_counter() - started
    connection.close()
    probe.close()
    return n / written, n / enqueued


def sync_confirms(settings: BrokerSettings, n: int) -> float:
    connection = connect(settings)
    channel = connection.channel()
    channel.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    started = time.perf_counter()
    for _ in range(n):
        channel.basic_publish("", QUEUE, BODY, props, mandatory=True)
    elapsed = time.perf_counter() - started
    connection.close()
    return n / elapsed


def messages(n: int, prefix: str) -> list[OutgoingMessage]:
    return [
        OutgoingMessage(
            body=BODY,
            message_id=f"{prefix}-{i}",
            exchange="",
            routing_key=QUEUE,
            content_type="application/json",
        )
        for i in range(n)
    ]


def our_publish(settings: BrokerSettings, n: int, window: int) -> float:
    batch = messages(n, f"p{time.time_ns()}")
    with PipelinedPublisher(settings, window=window) as publisher:
        # like the raw paths, connection set-up is outside the timing; every confirm is inside
        started = time.perf_counter()
        result = publisher.publish_many(batch).wait()
        elapsed = time.perf_counter() - started
    if result.failures:
        raise SystemExit(f"publisher: {len(result.failures)} failures: {result.failures[0][1]}")
    return n / elapsed


def raw_consume(settings: BrokerSettings, n: int) -> float:
    """Auto-ack consume of ``n`` messages, timed from connect to close like
    :func:`our_consume` (whose Consumer.run() connects, subscribes, cancels and closes)."""
    started = time.perf_counter()
    connection = connect(settings)
    channel = connection.channel()
    count = 0
    for method, _, _ in channel.consume(QUEUE, auto_ack=True, inactivity_timeout=5):
        if method is None:
            break
        count += 1
        if count == n:
            break
    channel.cancel()
    connection.close()
    return count / (time.perf_counter() - started)


def noop(task: Any, db: Any) -> None:
    """The bench handler: the dedup claim is the only write."""


def our_consume(settings: BrokerSettings, n: int, batch: int, path: Path) -> float:
    """Our consumer on ``n`` messages (manual ack in batches after the SQLite dedup commit),
    timed from connect to close: Consumer.run() includes both."""
    store = SqliteDedupStore(path)
    config = ConsumerConfig(
        BENCH_NAMES, prefetch=batch * 3, ack_batch=batch, max_messages=n, idle_exit=5
    )
    started = time.perf_counter()
    handled = Consumer(settings, noop, store, config, on_report=lambda r: None).run()
    elapsed = time.perf_counter() - started
    store.close()
    return handled / elapsed


def latency(settings: BrokerSettings, rate: int, seconds: float, batch: int) -> dict[str, float]:
    """Publish at ``rate`` msg/s with a send timestamp; a consumer process reports latencies."""
    n = int(rate * seconds)
    consumer = subprocess.Popen(
        [sys.executable, __file__, "--latency-consumer", str(n), "--batch", str(batch)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ,
    )
    wait_for_consumer(settings)  # latency is measured from here, not from process start
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
                    routing_key=QUEUE,
                    headers={"sent_ns": time.time_ns()},
                    content_type="application/json",
                )
            )
        publisher.flush()
    out, _ = consumer.communicate(timeout=120)
    return dict(json.loads(out.strip().splitlines()[-1]))


def latency_consumer(settings: BrokerSettings, n: int, batch: int) -> int:
    samples: list[float] = []

    def handler(task: Any, db: Any) -> None:
        samples.append((time.time_ns() - task.headers["sent_ns"]) / 1e6)

    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteDedupStore(Path(tmp) / "lat.sqlite3")
        Consumer(
            settings,
            handler,
            store,
            ConsumerConfig(
                BENCH_NAMES, prefetch=batch * 3, ack_batch=batch, max_messages=n, idle_exit=10
            ),
            on_report=lambda r: None,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--window", type=int, default=10000, help="unconfirmed in flight")
    parser.add_argument(
        "--batch", type=int, default=500, help="consumer ack batch (prefetch: 3 * batch)"
    )
    parser.add_argument("--rate", type=int, default=1000, help="latency test, msg/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="latency test duration")
    parser.add_argument(
        "--queue-mode",
        choices=("lazy", "default"),
        default=work_queue_mode(),
        help="the bench queue's x-queue-mode, which RabbitMQ 3.12+ ignores (default: what the "
        "topology's policy gives q:tasks)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--latency-consumer", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings = settings_from_env("amqp-lab bench", heartbeat=60)
    if args.latency_consumer is not None:
        return latency_consumer(settings, args.latency_consumer, args.batch)
    n = args.messages
    results: dict[str, list[float]] = {
        k: []
        for k in (
            "raw_fire_and_forget",
            "raw_fire_and_forget_enqueued",
            "pika_sync_confirms",
            "our_publisher",
            "raw_auto_ack_consume",
            "our_consumer",
        )
    }
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            fresh_queue(settings, args.queue_mode)
            written, enqueued = raw_publish(settings, n)
            results["raw_fire_and_forget"].append(written)
            results["raw_fire_and_forget_enqueued"].append(enqueued)
            fresh_queue(settings, args.queue_mode)
            results["pika_sync_confirms"].append(sync_confirms(settings, max(500, n // 10)))
            fresh_queue(settings, args.queue_mode)
            results["our_publisher"].append(our_publish(settings, n, args.window))
            wait_for_depth(settings, n)
            results["our_consumer"].append(
                our_consume(settings, n, args.batch, Path(tmp) / f"dedup-{r}.sqlite3")
            )
            # the auto-ack baseline consumes the same messages, published the same way
            fresh_queue(settings, args.queue_mode)
            our_publish(settings, n, args.window)
            wait_for_depth(settings, n)
            results["raw_auto_ack_consume"].append(raw_consume(settings, n))
            print(f"... repetition {r + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    fresh_queue(settings, args.queue_mode)
    median = {k: statistics.median(v) for k, v in results.items()}
    lat = latency(settings, args.rate, args.seconds, args.batch)
    rss_mb = (
        max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        / 1024
    )
    connection = connect(settings)
    connection.channel().queue_delete(QUEUE)
    connection.close()
    summary = {
        **{f"{k}_msg_s": round(v) for k, v in median.items()},
        "publisher_vs_fire_and_forget": round(
            median["our_publisher"] / median["raw_fire_and_forget"], 3
        ),
        "publisher_vs_enqueued": round(
            median["our_publisher"] / median["raw_fire_and_forget_enqueued"], 3
        ),
        "publisher_vs_sync_confirms": round(
            median["our_publisher"] / median["pika_sync_confirms"], 2
        ),
        "consumer_vs_auto_ack": round(median["our_consumer"] / median["raw_auto_ack_consume"], 3),
        **lat,
        "peak_rss_mb": round(rss_mb, 1),
        "messages": n,
        "repeat": args.repeat,
        "body_bytes": len(BODY),
        "queue_mode": args.queue_mode,
    }
    print(f"{n} persistent messages of {len(BODY)} bytes, queue-mode {args.queue_mode}")
    print(f"{'path':32} {'msg/s (median of ' + str(args.repeat) + ')':>22}")
    for key, value in median.items():
        print(f"{key:32} {value:>22,.0f}")
    print(
        f"publisher / fire-and-forget  {summary['publisher_vs_fire_and_forget']:>8} (target >= 0.7)"
    )
    print(
        f"publisher / f&f enqueued     {summary['publisher_vs_enqueued']:>8} "
        "(no target: fire-and-forget timed until every message is enqueued)"
    )
    print(f"publisher / sync confirms    {summary['publisher_vs_sync_confirms']:>8} (target >= 8)")
    print(f"consumer / auto-ack          {summary['consumer_vs_auto_ack']:>8} (target >= 0.5)")
    print(
        f"latency at {args.rate} msg/s: p50 {lat['latency_p50_ms']} ms, "
        f"p99 {lat['latency_p99_ms']} ms (target p99 < 20)"
    )
    print(f"peak RSS {summary['peak_rss_mb']} MB")
    if args.json:
        print(json.dumps(summary))
    return EXIT_OK


if __name__ == "__main__":
    run(main)
