#!/usr/bin/env python3
"""Publishing through the outbox: relay throughput against the pipelined publisher in the same
run, and commit-to-confirm latency.

* **Throughput.** Per repetition, on fresh queues of the broker of ``EAI_AMQP_URL``: the
  ``PipelinedPublisher`` publishes N persistent 256-byte messages (confirms, mandatory,
  message_id; timed until the last confirm); then N rows over ``--keys`` ordering keys, committed
  in transactions of 500 before the clock starts, are relayed by one ``OutboxRelay`` (timed from
  its start until every row is confirmed and recorded as sent). The ratio is the target (>=
  0.7x). Each path is also timed from its first publisher confirm (``*_steady``): the
  publisher's clock starts once it is connected, the relay's before it connects to the
  database and the broker and takes its first lease, so the first figure counts the relay's
  start and the second counts neither path's. With ``--one-key M`` also M rows on a single
  key: a key goes one confirm round trip per message.
* **Latency.** Writers commit one row per transaction at ``--rate`` rows/s for ``--seconds``
  while a relay runs; from each transaction's commit (returned) to the relay seeing its
  publisher confirm: p50 and p99 (ms), woken by NOTIFY on PostgreSQL, by polling on SQLite.

The outbox is a fresh database on the PostgreSQL server of ``--postgres`` (created and dropped:
the shared server is only written to), or a SQLite file (``--store sqlite``).

    python benchmarks/outbox.py [--store postgresql|sqlite] [--messages 20000] [--keys 1000]
        [--repeat 3] [--window 1000] [--batch 500] [--batches 2] [--rate 200] [--seconds 10]
        [--one-key 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# isort: split
# Started by another Python than the repository's .venv, scripts/_cli re-executes this file with
# the venv's interpreter (as every script does), before any dependency is imported.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import _cli  # noqa: F401

# isort: split

import psycopg

from amqp_lab.cli.common import EXIT_OK, add_gc_option, run, settings_from_env
from amqp_lab.cli.parser import CommandParser
from amqp_lab.connection import open_channel
from amqp_lab.errors import OutboxUnavailable, error_text
from amqp_lab.gc_policy import tune_gc
from amqp_lab.message import OutgoingMessage
from amqp_lab.outbox import add
from amqp_lab.outbox.observer import NoRelayObserver, RelayConfig
from amqp_lab.outbox.outcomes import Verdict
from amqp_lab.outbox.relay import OutboxRelay
from amqp_lab.outbox.row import OutboxRow
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.publishing.observer import NoPublisherObserver
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings, mask_url

BODY = b'{"payload":"' + b"x" * 240 + b'"}'  # 256 bytes, as benchmarks/bench.py
PREFIX = "q:bench-outbox"


class Counting(NoRelayObserver):
    """Counts sent rows; records when each one's confirm reached the relay (time.time())."""

    def __init__(self, expected: int) -> None:
        self.expected, self.sent, self.seen = expected, 0, threading.Event()
        self.confirmed_at: dict[str, float] = {}

    def relayed(self, row: OutboxRow, verdict: Verdict, lag: float | None) -> None:
        if verdict is Verdict.SENT:
            self.confirmed_at.setdefault(row.message_id, time.time())
            self.sent += 1
            if self.sent >= self.expected:
                self.seen.set()


class FirstOutcome(NoPublisherObserver):
    """When the publisher settled its first publish (perf_counter; None before)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def outcome(self, exchange: str, outcome: str) -> None:
        if self.at is None:
            self.at = time.perf_counter()


@dataclass(frozen=True)
class Rate:
    """One path's msg/s over ``n`` messages: ``total`` from its start (the relay's start, or
    the publisher's first publish) to its end, ``steady`` from its first publisher confirm to
    its end - what each path does once it runs, without the relay's connections and first
    lease, and without either path's first confirm round trip."""

    total: float
    steady: float


def rate(n: int, started: float, first: float | None, ended: float) -> Rate:
    """``steady``: the n - 1 outcomes after the first, over the time after it."""
    if first is None or n < 2:
        return Rate(n / (ended - started), n / (ended - started))
    return Rate(n / (ended - started), (n - 1) / (ended - first))


@contextmanager
def outbox_database(args: argparse.Namespace) -> Iterator[str]:
    """A fresh outbox: a database on ``--postgres``'s server, or a SQLite file."""
    if args.store == "sqlite":
        with tempfile.TemporaryDirectory(prefix="amqp-lab-bench-") as tmp:
            yield str(Path(tmp) / "outbox.sqlite3")
        return
    name = f"amqp_lab_bench_{uuid.uuid4().hex[:10]}"
    admin_sql(args.postgres, f'CREATE DATABASE "{name}"')
    try:
        yield database_url(args.postgres, name)
    finally:
        admin_sql(args.postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_url(admin: str, name: str) -> str:
    """The URL of database ``name`` on the server of the URL ``admin``, its query
    (``sslmode=...``) kept. ``//`` always follows the scheme: ``urlunsplit`` drops it when
    there is no host (``postgresql:///postgres``, the local socket), and libpq refuses
    ``postgresql:/name``."""
    parts = urlsplit(admin)
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{parts.netloc}/{name}{query}"


def admin_sql(url: str, statement: str) -> None:
    """Run ``statement`` on the ``--postgres`` server. Raises OutboxUnavailable naming the
    masked URL when the server cannot be reached or refuses it (one line from ``run``)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as admin:
            admin.execute(statement)
    except psycopg.Error as e:
        text = " ".join(error_text(e).split())  # libpq's lines, as one
        raise OutboxUnavailable(f"PostgreSQL at {mask_url(url)}: {text}") from e


def connect(url: str) -> Any:
    return psycopg.connect(url) if url.startswith("postgresql") else sqlite3.connect(url)


def fresh_queue(settings: BrokerSettings) -> str:
    queue = f"{PREFIX}:{uuid.uuid4().hex[:8]}"
    with open_channel(settings) as channel:
        channel.queue_declare(queue, durable=True)
    return queue


def delete_queue(settings: BrokerSettings, queue: str) -> None:
    with open_channel(settings) as channel:
        channel.queue_delete(queue)


def message(queue: str, message_id: str) -> OutgoingMessage:
    return OutgoingMessage(body=BODY, message_id=message_id, exchange="", routing_key=queue)


def pipelined(settings: BrokerSettings, n: int, window: int) -> Rate:
    """PipelinedPublisher.publish_many on ``n`` messages, connected before the clock starts,
    until the last outcome."""
    queue = fresh_queue(settings)
    batch = [message(queue, f"p-{i}") for i in range(n)]
    first = FirstOutcome()
    try:
        with PipelinedPublisher(settings, window=window, observer=first) as publisher:
            started = time.perf_counter()
            result = publisher.publish_many(batch).wait(600)
            ended = time.perf_counter()
    finally:
        delete_queue(settings, queue)
    if result.failures:
        raise SystemExit(f"publisher: {len(result.failures)} failures: {result.failures[0][1]}")
    return rate(n, started, first.at, ended)


def fill(url: str, queue: str, n: int, keys: int, tag: str) -> None:
    db = connect(url)
    try:
        for start in range(0, n, 500):
            for i in range(start, min(n, start + 500)):
                key = f"key-{i % keys}" if keys else None
                add(db, message(queue, f"{tag}-{i}"), key=key, notify=False)
            db.commit()
    finally:
        db.close()


def relayed(
    settings: BrokerSettings, url: str, n: int, keys: int, args: argparse.Namespace
) -> Rate:
    """One relay over ``n`` committed rows on ``keys`` keys (0: none), from its start (its
    connections included) until every row is confirmed and recorded."""
    queue = fresh_queue(settings)
    try:
        fill(url, queue, n, keys, f"r{uuid.uuid4().hex[:6]}")
        counting = Counting(n)
        config = RelayConfig(batch_rows=args.batch, window=args.window, batches=args.batches)
        first = FirstOutcome()
        relay = OutboxRelay(settings, url, config, observer=counting, publisher_observer=first)
        started = time.perf_counter()
        relay.start_thread()
        store = OutboxStore(url)
        try:
            if not counting.seen.wait(600):
                raise SystemExit(f"relay: {counting.sent} of {n} sent in 600 s")
            while store.status().pending:  # recorded as sent, not only confirmed
                time.sleep(0.005)
            ended = time.perf_counter()
        finally:
            store.close()
            relay.stop()
            relay.join(60)
    finally:
        delete_queue(settings, queue)
    return rate(n, started, first.at, ended)


def latency(settings: BrokerSettings, url: str, args: argparse.Namespace) -> dict[str, float]:
    """Commit-to-confirm percentiles (ms) of rows committed one per transaction at
    ``--rate``/s for ``--seconds``, with a relay running."""
    queue = fresh_queue(settings)
    total = int(args.rate * args.seconds)
    counting = Counting(total)
    relay = OutboxRelay(settings, url, RelayConfig(batch_rows=args.batch), observer=counting)
    relay.start_thread()
    committed: dict[str, float] = {}
    db = connect(url)
    try:
        time.sleep(1.0)  # the relay connected and listening
        started = time.monotonic()
        for i in range(total):
            time.sleep(max(0.0, started + i / args.rate - time.monotonic()))
            message_id = f"lat-{i}"
            add(db, message(queue, message_id), key=f"key-{i % 100}")
            db.commit()
            committed[message_id] = time.time()
        if not counting.seen.wait(120):
            raise SystemExit(f"latency: {counting.sent} of {total} confirmed in 120 s")
    finally:
        db.close()
        relay.stop()
        relay.join(60)
        delete_queue(settings, queue)
    ms = sorted(1000 * (counting.confirmed_at[m] - t) for m, t in committed.items())
    return {
        "commit_to_confirm_p50_ms": round(statistics.median(ms), 2),
        "commit_to_confirm_p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
        "commit_to_confirm_max_ms": round(ms[-1], 2),
        "latency_rows": total,
    }


def parse_args() -> argparse.Namespace:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="an admin URL: the bench creates its database there and drops it",
    )
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--keys", type=int, default=1000, help="ordering keys (0: none)")
    parser.add_argument("--one-key", type=int, default=2000, metavar="M", help="0: skip")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=int, default=1000, help="unconfirmed in flight")
    parser.add_argument("--batch", type=int, default=500, help="rows per relay lease")
    parser.add_argument("--batches", type=int, default=2, help="relay batches in flight")
    parser.add_argument("--rate", type=float, default=200.0, help="latency: rows/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency: duration")
    add_gc_option(parser)  # the worker's and relay's option, parsed the same way
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.messages, args.repeat, args.window, args.batch, args.batches) < 1:
        parser.error("--messages, --repeat, --window, --batch and --batches must be >= 1")
    if args.keys < 0 or args.one_key < 0:
        parser.error("--keys and --one-key must be >= 0")
    # before, a latency run of no rows waited 120 s for the first, and --one-key -3 600 s
    if not args.rate > 0 or not args.seconds > 0 or int(args.rate * args.seconds) < 1:
        parser.error("--rate and --seconds must be > 0, with --rate x --seconds >= 1 row")
    return args


def main() -> int:
    args = parse_args()
    settings = settings_from_env("amqp-lab bench outbox", heartbeat=60)
    tune_gc(args.gc_young_threshold)  # what amqp-lab-relay does once started, for both paths
    publisher: list[Rate] = []
    relay: list[Rate] = []
    one_key: list[float] = []
    with outbox_database(args) as url:
        OutboxStore(url).close()
        for r in range(args.repeat):
            pair: list[tuple[str, Callable[[], Rate]]] = [
                ("publisher", lambda: pipelined(settings, args.messages, args.window)),
                ("relay", lambda: relayed(settings, url, args.messages, args.keys, args)),
            ]
            for name, measure in pair if r % 2 == 0 else pair[::-1]:
                value = measure()
                (publisher if name == "publisher" else relay).append(value)
                print(
                    f"repetition {r + 1}: {name} {value.total:,.0f} msg/s"
                    f" (from the first confirm {value.steady:,.0f})",
                    file=sys.stderr,
                )
            if args.one_key:
                one_key.append(relayed(settings, url, args.one_key, 1, args).total)
        lat = latency(settings, url, args)
    summary: dict[str, Any] = {
        "store": args.store,
        **compare([p.total for p in publisher], [r.total for r in relay], ""),
        **compare([p.steady for p in publisher], [r.steady for r in relay], "_steady"),
        "relay_one_key_msg_s": round(statistics.median(one_key)) if one_key else None,
        **lat,
        "messages": args.messages,
        "keys": args.keys,
        "one_key_messages": args.one_key,
        "repeat": args.repeat,
        "window": args.window,
        "batch": args.batch,
        "batches": args.batches,
        "body_bytes": len(BODY),
        "latency_rate": args.rate,
        "gc_young_threshold": args.gc_young_threshold,
    }
    print_report(summary)
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    return EXIT_OK


def compare(publisher: list[float], relay: list[float], suffix: str) -> dict[str, Any]:
    """Medians, ranges and the ratio of the two paths' msg/s, the keys ending in ``suffix``."""
    ratios = [a / b for a, b in zip(relay, publisher, strict=True)]
    return {
        f"publisher{suffix}_msg_s": round(statistics.median(publisher)),
        f"publisher{suffix}_msg_s_range": [round(min(publisher)), round(max(publisher))],
        f"relay{suffix}_msg_s": round(statistics.median(relay)),
        f"relay{suffix}_msg_s_range": [round(min(relay)), round(max(relay))],
        f"relay_vs_publisher{suffix}": round(
            statistics.median(relay) / statistics.median(publisher), 3
        ),
        f"relay_vs_publisher{suffix}_range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


def print_report(s: dict[str, Any]) -> None:
    print(
        f"outbox on {s['store']}: {s['messages']} messages of {s['body_bytes']} bytes, "
        f"{s['keys']} keys, median of {s['repeat']}"
    )
    print(
        f"  pipelined publisher      {s['publisher_msg_s']:>8,} msg/s  {s['publisher_msg_s_range']}"
    )
    print(f"  outbox relay             {s['relay_msg_s']:>8,} msg/s  {s['relay_msg_s_range']}")
    print(
        f"  relay / publisher        {s['relay_vs_publisher']:>8}        "
        f"{s['relay_vs_publisher_range']} (target >= 0.7)"
    )
    print(
        f"  from the first confirm   publisher {s['publisher_steady_msg_s']:,}, relay"
        f" {s['relay_steady_msg_s']:,} msg/s: {s['relay_vs_publisher_steady']}"
        f" {s['relay_vs_publisher_steady_range']}"
    )
    if s["relay_one_key_msg_s"] is not None:
        print(f"  relay, one key           {s['relay_one_key_msg_s']:>8,} msg/s")
    print(
        f"  commit -> confirm        p50 {s['commit_to_confirm_p50_ms']} ms, "
        f"p99 {s['commit_to_confirm_p99_ms']} ms at {s['latency_rate']:g} rows/s"
    )


if __name__ == "__main__":
    run(main)
