#!/usr/bin/env python3
"""Where a consumer's wall time goes: on a CPU (which thread) or off it, per delivery.

Three ways to consume the same messages on the broker of ``EAI_AMQP_URL``, each on a freshly
declared queue holding ``--messages`` persistent 256-byte messages (bench.py's queue and
messages), timed from connect to close, in an order that rotates from one run to the next:

* ``raw_auto_ack``: pika's consume generator with auto-ack (bench.py's denominator);
* ``pika_manual_ack``: the same generator with manual acks - prefetch 3 x ``--batch`` and one
  basic.ack(multiple=True) per ``--batch`` deliveries, nothing else: the floor under any
  consumer that acks after its work;
* ``our_consumer``: bench.py's consumer (SQLite dedup store, batches of ``--batch``).

For each, in microseconds per delivery: ``wall``; ``cpu``, the process's CPU time (every
thread); ``io_thread``, the CPU time of the thread that reads the socket and settles (this
one: every path's consume loop runs in the calling thread); ``other_threads``, the rest of
``cpu`` (our consumer's handler thread); and ``wall_minus_cpu``, a lower bound of the time no
thread of the process was on a CPU (time both threads ran at once - the GIL is released
inside SQLite and system calls - is subtracted from it): waiting for the broker, for a disk
flush, or for a CPU the broker's own threads hold on a small machine. For our consumer also
the units it ran (one store transaction and one basic.ack each; a unit of one delivery has
no batch transaction and is not counted) and their mean size. Each figure is the median of
``--repeat`` runs, with its range; each is its own median, so the columns of a row need not
add up.

    python benchmarks/walltime.py [--messages 20000] [--repeat 5] [--batch 500] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# isort: split
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import _cli  # noqa: F401

# isort: split

from amqp_lab.cli.common import EXIT_OK, add_gc_option, run, settings_from_env
from amqp_lab.cli.parser import CommandParser
from amqp_lab.connection import connect
from amqp_lab.consuming.consumer import Consumer
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.gc_policy import tune_gc
from amqp_lab.settings import BrokerSettings
from benchmarks.bench import (
    BenchQueues,
    consumer_config,
    noop,
    our_publish,
    queue_arguments,
    raw_consume,
    wait_for_depth,
    work_queue_mode,
)
from benchmarks.history import broker_version

PATHS = ("raw_auto_ack", "pika_manual_ack", "our_consumer")
FIGURES = ("wall", "cpu", "io_thread", "other_threads", "wall_minus_cpu")


class CountingStore(SqliteDedupStore):
    """The SQLite dedup store, counting the units it committed (``process_batch``: one
    transaction each) and their deliveries - per unit, so nothing per delivery is added (an
    observer would be guarded, a wrapper per delivery)."""

    units = 0
    deliveries = 0

    def process_batch(
        self, batch: list[tuple[str, Callable[[Any], None]]]
    ) -> list[bool | BaseException]:
        """SqliteDedupStore.process_batch, counted once it committed (a try the consumer's
        StoreRetry repeats after an outage counts once; one that raised, not at all)."""
        results = super().process_batch(batch)
        self.units += 1
        self.deliveries += len(batch)
        return results


def received(consume: Callable[[BrokerSettings, str, int], tuple[float, int]], *args: Any) -> int:
    """The messages a bench.py consume path (``(msg/s, received)``) received."""
    return consume(*args)[1]


def pika_manual_ack(settings: BrokerSettings, queue: str, n: int, batch: int) -> int:
    """basic.qos 3 x ``batch``, then basic.consume ``queue`` through pika's consume generator
    with one basic.ack(multiple=True) per ``batch`` deliveries (and one for the rest), until
    ``n`` messages came or none for 5 s: the number received (``batch`` sets the qos and the
    acks). pika's errors pass through."""
    connection = connect(settings)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=3 * batch)
    count, last = 0, 0
    for method, _, _ in channel.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        count += 1
        last = method.delivery_tag
        if count % batch == 0:
            channel.basic_ack(last, multiple=True)
        if count == n:
            break
    if count % batch:
        channel.basic_ack(last, multiple=True)
    channel.cancel()
    connection.close()
    return count


def timed(consume: Callable[[], int], n: int) -> dict[str, float]:
    """Run ``consume`` (in this thread) and return its figures (:data:`FIGURES`) in µs per
    delivery; raises SystemExit if it did not see ``n`` messages."""
    wall0, cpu0, io0 = time.perf_counter(), time.process_time(), time.thread_time()
    seen = consume()
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    io = time.thread_time() - io0
    if seen != n:
        raise SystemExit(f"saw {seen} of {n} messages")
    us = {"wall": wall, "cpu": cpu, "io_thread": io, "other_threads": cpu - io}
    us["wall_minus_cpu"] = wall - cpu
    return {k: v / n * 1e6 for k, v in us.items()}


def repetition(
    settings: BrokerSettings,
    queues: BenchQueues,
    args: argparse.Namespace,
    tmp: Path,
    order: tuple[str, ...] = PATHS,
) -> dict[str, dict[str, float]]:
    """One run of every path, in ``order``: for each, a fresh queue (the previous one deleted),
    ``--messages`` confirmed publishes into it, then the consume, timed. Returns each path's
    figures (µs per delivery; our consumer's also ``units`` and ``mean_unit``). Raises
    SystemExit when a path did not see every message; pika's errors pass through."""
    n, batch = args.messages, args.batch
    out: dict[str, dict[str, float]] = {}
    for path in order:
        queue = queues.fresh(settings)
        our_publish(settings, queue, n, 10000)
        wait_for_depth(settings, queue, n)
        if path == "our_consumer":
            store = CountingStore(tmp / f"dedup-{time.time_ns()}.sqlite3")
            config = consumer_config(queue, batch, n, 1, 5)
            ours = Consumer(settings, noop, store, config, on_report=lambda r: None)
            try:
                out[path] = timed(ours.run, n)
            finally:
                store.close()
            out[path]["units"] = store.units
            out[path]["mean_unit"] = store.deliveries / max(1, store.units)
        elif path == "raw_auto_ack":  # bench.py's own path, timed here as the others
            out[path] = timed(functools.partial(received, raw_consume, settings, queue, n), n)
        else:
            out[path] = timed(functools.partial(pika_manual_ack, settings, queue, n, batch), n)
    return out


def main() -> int:
    """Parse the options, measure ``--repeat`` runs (the paths' order rotating from one run to
    the next), print the table or ``--json``'s summary; the bench queues are deleted even when
    a run fails."""
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=500, help="ack batch (prefetch 3 x batch)")
    add_gc_option(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.messages, args.repeat, args.batch) < 1:
        parser.error("--messages, --repeat and --batch must be at least 1")
    settings = settings_from_env("amqp-lab walltime", heartbeat=60)
    tune_gc(args.gc_young_threshold)
    queues = BenchQueues(queue_arguments("classic", work_queue_mode()))
    runs: list[dict[str, dict[str, float]]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeat):
                order = PATHS[r % len(PATHS) :] + PATHS[: r % len(PATHS)]
                runs.append(repetition(settings, queues, args, Path(tmp), order))
    finally:
        queues.delete(settings)
    summary: dict[str, Any] = {
        "messages": args.messages,
        "repeat": args.repeat,
        "batch": args.batch,
        "gc_young_threshold": args.gc_young_threshold,
        "queue_arguments": queues.arguments,
        "broker_version": broker_version(settings),
    }
    for path in PATHS:
        for figure in runs[0][path]:
            values = [r[path][figure] for r in runs]
            summary[f"{path}_{figure}"] = round(statistics.median(values), 2)
            summary[f"{path}_{figure}_range"] = [round(min(values), 2), round(max(values), 2)]
    if args.json:
        print(json.dumps(summary, allow_nan=False))
        return EXIT_OK
    print(
        f"RabbitMQ {summary['broker_version']}: µs per delivery, median of {args.repeat} runs "
        f"of {args.messages} (range; each column its own median)"
    )
    print(f"{'path':<16}" + "".join(f"{f:>22}" for f in FIGURES))
    for path in PATHS:
        cells = "".join(
            f"{summary[f'{path}_{f}']:>9.1f} ({summary[f'{path}_{f}_range'][0]:.1f}-"
            f"{summary[f'{path}_{f}_range'][1]:.1f})".rjust(22)
            for f in FIGURES
        )
        print(f"{path:<16}{cells}")
    print(
        f"our consumer: {summary['our_consumer_units']:.0f} units "
        f"of {summary['our_consumer_mean_unit']:.0f} deliveries at the median"
    )
    return EXIT_OK


if __name__ == "__main__":
    run(main)
