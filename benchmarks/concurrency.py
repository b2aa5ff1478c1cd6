#!/usr/bin/env python3
"""Concurrency: msg/s with a slow handler, threads in one process against processes.

The handler sleeps ``--handler-seconds`` (0.2: an external call) and then writes one row, inside
the dedup transaction, to a table of the bench's own. Four cases, each on a freshly declared
queue holding ``--messages`` persistent messages:

* baseline: 1 process, concurrency 1 (SQLite store);
* threads: 1 process, concurrency ``--concurrency`` (8; SQLite store);
* processes_sqlite: ``--processes`` (4) processes, concurrency 1, sharing one SQLite file;
* processes_postgres: the same processes sharing PostgreSQL (``--postgres-url``; tables in a
  schema of the bench's own, dropped afterwards; ``--skip-postgres`` leaves the case out).

Each consumer is a worker process (this file, ``--worker``) that builds a Consumer directly,
with prefetch ``--prefetch-factor`` x concurrency. The workers start, open their store, say
they are ready and wait for "go" on stdin; the clock starts once the queue has every
consumer (consumer count polled every 5 ms) and stops when the handler's table holds every
row (polled every 10 ms). Then the workers are told to stop and report what they handled.
Targets: threads >= 6x baseline, processes_sqlite >= 3.5x; a missed target is printed, not an
error (exit 1 only when something fails).

    python benchmarks/concurrency.py [--messages 240] [--handler-seconds 0.2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
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
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# isort: split
# Started by another Python than the repository's .venv, scripts/_cli re-executes this file with
# the venv's interpreter (as every script does), before any dependency is imported.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import _cli  # noqa: F401

# isort: split

import psycopg
from psycopg import sql

from amqp_lab.cli.common import EXIT_FAILED, EXIT_OK, run, settings_from_env
from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.progress import Progress
from amqp_lab.connection import connect
from amqp_lab.consuming.consumer import Consumer, ConsumerConfig, DeliveryReport
from amqp_lab.dedup import open_store
from amqp_lab.errors import ConfigurationError
from amqp_lab.message import OutgoingMessage
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import Names

QUEUE = "q:bench-concurrency"
# No DLX or wait queues: the handler never fails.
NAMES = Names(exchange="", routing_key=QUEUE, queue=QUEUE, dead_letter_exchange="", dlq="")
ROWS_TABLE = "bench_concurrency_rows"
BODY = b'{"kind":"ok","seq":0}'
DEFAULT_POSTGRES = os.environ.get(
    "AMQP_LAB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TARGETS = {"threads": 6.0, "processes_sqlite": 3.5}  # x baseline msg/s
POLL_CONSUMERS = 0.005
POLL_ROWS = 0.01


@dataclass(frozen=True)
class Case:
    """One measured configuration: ``key`` (the JSON key), a readable ``label``, how many
    worker ``processes`` with how many handler threads each (``concurrency``), and the store
    (``sqlite`` or ``postgresql``)."""

    key: str
    label: str
    processes: int
    concurrency: int
    store: str


@dataclass(frozen=True)
class Measured:
    """A case's outcome: msg/s over ``seconds`` (all consumers subscribed -> last row),
    ``per_process`` deliveries handled, the prefetch used, and how many rows were already
    written when the clock started (0 unless subscribing took longer than a handler)."""

    case: Case
    msg_s: float
    seconds: float
    per_process: list[int]
    prefetch: int
    done_before_start: int


# --- the worker process -----------------------------------------------------------------------
def slow_handler(seconds: float, worker: int, task: Any, db: Any) -> None:
    """The handler: an external call of ``seconds`` (a sleep, outside any lock), then one row
    in the bench's table through the dedup transaction's ``db``."""
    time.sleep(seconds)
    db.execute(
        f"INSERT INTO {ROWS_TABLE} (message_id, worker, done_at) VALUES (?, ?, ?)",
        (task.message_id, worker, time.time()),
    )


def worker(settings: BrokerSettings, args: argparse.Namespace) -> int:
    """``--worker``: open the store, print "ready", wait for "go" on stdin, consume until
    "stop" (or end of input), then print one JSON line with the deliveries handled."""
    store = open_store(args.store)
    outcomes: dict[str, int] = {}

    def report(r: DeliveryReport) -> None:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1

    consumer = Consumer(
        settings,
        lambda task, db: slow_handler(args.handler_seconds, args.worker_id, task, db),
        store,
        ConsumerConfig(
            NAMES, prefetch=args.prefetch, concurrency=args.concurrency, verify_topology=False
        ),
        on_report=report,
    )
    go = threading.Event()

    def control() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                go.set()
            elif line.strip() == "stop":
                break
        go.set()  # end of input (the bench died) stops us too
        consumer.stop("bench done")

    threading.Thread(target=control, daemon=True).start()
    print("ready", flush=True)
    go.wait()
    try:
        handled = consumer.run()
    finally:
        store.close()
    print(json.dumps({"worker": args.worker_id, "handled": handled, "outcomes": outcomes}))
    return EXIT_OK


# --- the bench --------------------------------------------------------------------------------
def fresh_queue(settings: BrokerSettings) -> None:
    """Delete the bench queue and declare it again, empty (durable, classic like q:tasks)."""
    connection = connect(settings)
    channel = connection.channel()
    channel.queue_delete(QUEUE)
    channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "classic"})
    connection.close()


def delete_queue(settings: BrokerSettings) -> None:
    """Delete the bench queue; a failure is a warning (it must not hide the error that ended
    a run, and a leftover empty queue harms nothing)."""
    try:
        connection = connect(settings)
        connection.channel().queue_delete(QUEUE)
        connection.close()
    except Exception as e:
        print(f"warning: could not delete {QUEUE}: {e}", file=sys.stderr)


def publish(settings: BrokerSettings, n: int, prefix: str) -> None:
    """Publish ``n`` persistent messages with confirms and wait until the queue holds them all
    (SystemExit when a publish fails or the queue does not get there within 60 s)."""
    batch = [
        OutgoingMessage(body=BODY, message_id=f"{prefix}-{i}", exchange="", routing_key=QUEUE)
        for i in range(n)
    ]
    with PipelinedPublisher(settings, window=1000) as publisher:
        result = publisher.publish_many(batch).wait()
    if result.failures:
        raise SystemExit(f"publisher: {len(result.failures)} failures: {result.failures[0][1]}")
    connection = connect(settings)
    channel = connection.channel()
    deadline = time.monotonic() + 60
    try:
        while channel.queue_declare(QUEUE, passive=True).method.message_count < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"the bench queue did not reach {n} messages in time")
            time.sleep(0.01)
    finally:
        connection.close()


def with_search_path(url: str, schema: str) -> str:
    """``url`` with ``options=-csearch_path=<schema>``, so the store's tables go there."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    options = " ".join([v for k, v in query if k == "options"] + [f"-csearch_path={schema}"])
    query = [(k, v) for k, v in query if k != "options"] + [("options", options)]
    return urlunsplit(parts._replace(query=urlencode(query)))


@contextmanager
def sqlite_store(directory: Path, name: str) -> Iterator[tuple[str, Callable[[], int]]]:
    """A fresh SQLite dedup file with the handler's table: (its path, a row counter)."""
    path = directory / f"{name}.sqlite3"
    open_store(path).close()  # the dedup schema, WAL mode
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(
        f"CREATE TABLE {ROWS_TABLE} (message_id TEXT PRIMARY KEY, worker INTEGER, done_at REAL)"
    )
    try:
        yield str(path), lambda: int(db.execute(f"SELECT count(*) FROM {ROWS_TABLE}").fetchone()[0])
    finally:
        db.close()


def postgres_admin(admin_url: str) -> psycopg.Connection[Any]:
    """An autocommit connection to ``admin_url``; ConfigurationError when it cannot be had."""
    try:
        return psycopg.connect(admin_url, autocommit=True, connect_timeout=5)
    except psycopg.Error as e:
        detail = " ".join(str(e).split())
        raise ConfigurationError(
            f"PostgreSQL at {urlsplit(admin_url).netloc} is unreachable ({detail}); "
            "--skip-postgres leaves that case out"
        ) from e


@contextmanager
def postgres_store(admin_url: str) -> Iterator[tuple[str, Callable[[], int]]]:
    """A schema of the bench's own (``bench_concurrency_<hex>``) holding the dedup tables and
    the handler's: (a store URL whose search_path is that schema, a row counter). The schema
    is dropped afterwards."""
    schema = f"bench_concurrency_{uuid.uuid4().hex[:10]}"
    db = postgres_admin(admin_url)
    try:
        db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        db.execute(
            sql.SQL(
                "CREATE TABLE {}.{} (message_id TEXT PRIMARY KEY, worker INTEGER, "
                "done_at DOUBLE PRECISION)"
            ).format(sql.Identifier(schema), sql.Identifier(ROWS_TABLE))
        )
        url = with_search_path(admin_url, schema)
        open_store(url).close()  # the dedup schema, once, before the workers race for it
        count = sql.SQL("SELECT count(*) FROM {}.{}").format(
            sql.Identifier(schema), sql.Identifier(ROWS_TABLE)
        )

        def rows() -> int:
            found = db.execute(count).fetchone()
            return int(found[0]) if found else 0

        yield url, rows
    finally:
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        db.close()


def consumer_count(channel: Any) -> int:
    """Consumers subscribed to the bench queue now (passive queue.declare)."""
    return int(channel.queue_declare(QUEUE, passive=True).method.consumer_count)


def start_workers(
    case: Case, store_url: str, prefetch: int, handler_seconds: float
) -> list[subprocess.Popen[str]]:
    """Start the case's worker processes and wait until each has said "ready"."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                "--store",
                store_url,
                "--worker-id",
                str(i),
                "--concurrency",
                str(case.concurrency),
                "--prefetch",
                str(prefetch),
                "--handler-seconds",
                str(handler_seconds),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ,
        )
        for i in range(case.processes)
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            stop_workers(procs, timeout=1)
            raise SystemExit(f"a {case.label} worker did not start (exit {proc.wait()})")
    return procs


def tell(proc: subprocess.Popen[str], line: str) -> None:
    """Send ``line`` to a worker's stdin (ignoring one that has gone away)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    except (BrokenPipeError, OSError):
        pass


def stop_workers(procs: list[subprocess.Popen[str]], timeout: float = 30) -> list[int]:
    """Tell the workers to stop and collect what each handled; kill any that does not exit
    within ``timeout`` s. Raises SystemExit when one failed."""
    for proc in procs:
        tell(proc, "stop")
    handled: list[int] = []
    failed: list[str] = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failed.append(f"worker pid {proc.pid} did not stop within {timeout:g} s")
            continue
        lines = out.strip().splitlines()
        if proc.returncode != 0 or not lines:
            failed.append(f"worker pid {proc.pid} exited {proc.returncode}")
            continue
        handled.append(int(json.loads(lines[-1])["handled"]))
    if failed:
        raise SystemExit("; ".join(failed))
    return handled


def measure(
    settings: BrokerSettings,
    case: Case,
    n: int,
    handler_seconds: float,
    prefetch_factor: int,
    store: tuple[str, Callable[[], int]],
    on_rows: Callable[[int], None] = lambda rows: None,
) -> Measured:
    """Publish ``n`` messages to a fresh queue, start the workers, and time them from "every
    consumer subscribed" to "every row written"; ``on_rows(count)`` while they write."""
    store_url, rows = store
    prefetch = max(1, prefetch_factor * case.concurrency)
    fresh_queue(settings)
    publish(settings, n, f"{case.key}-{time.time_ns()}")
    procs = start_workers(case, store_url, prefetch, handler_seconds)
    connection = connect(settings)
    try:
        channel = connection.channel()
        deadline = time.monotonic() + 60
        for proc in procs:
            tell(proc, "go")
        while consumer_count(channel) < case.processes:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"{case.label}: the workers did not all subscribe")
            time.sleep(POLL_CONSUMERS)
        started = time.perf_counter()
        done_before = rows()
        # generous: ten times what one handler at a time would take
        deadline = time.monotonic() + 30 + 10 * n * handler_seconds
        while (written := rows()) < n:
            on_rows(written)
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"{case.label}: only {rows()} of {n} messages were handled")
            time.sleep(POLL_ROWS)
        elapsed = time.perf_counter() - started
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.communicate()
        raise
    finally:
        connection.close()
    per_process = stop_workers(procs)
    if sum(per_process) != n:
        raise SystemExit(f"{case.label}: the workers handled {sum(per_process)}, expected {n}")
    return Measured(case, n / elapsed, elapsed, per_process, prefetch, done_before)


def cases(processes: int, concurrency: int, skip_postgres: bool) -> list[Case]:
    """The cases to run, baseline first."""
    found = [
        Case("baseline", "1 process, concurrency 1", 1, 1, "sqlite"),
        Case("threads", f"1 process, concurrency {concurrency}", 1, concurrency, "sqlite"),
        Case(
            "processes_sqlite",
            f"{processes} processes, concurrency 1, SQLite",
            processes,
            1,
            "sqlite",
        ),
    ]
    if not skip_postgres:
        found.append(
            Case(
                "processes_postgres",
                f"{processes} processes, concurrency 1, PostgreSQL",
                processes,
                1,
                "postgresql",
            )
        )
    return found


def summarize(results: list[Measured], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON summary: every case with its msg/s and ratio to the baseline, the ratios
    again at the top level, the targets and whether they were met."""
    baseline = results[0].msg_s
    summary: dict[str, Any] = {
        "messages": args.messages,
        "handler_seconds": args.handler_seconds,
        "prefetch_factor": args.prefetch_factor,
        "cases": {},
        "ratios": {},
        "targets": {f"{k}_vs_baseline": v for k, v in TARGETS.items()},
        "targets_missed": [],
    }
    for m in results:
        ratio = m.msg_s / baseline
        summary["cases"][m.case.key] = {
            "label": m.case.label,
            "processes": m.case.processes,
            "concurrency": m.case.concurrency,
            "store": m.case.store,
            "prefetch": m.prefetch,
            "msg_s": round(m.msg_s, 2),
            "seconds": round(m.seconds, 3),
            "vs_baseline": round(ratio, 3),
            "per_process": m.per_process,
            "done_before_start": m.done_before_start,
        }
        if m.case.key != "baseline":
            summary["ratios"][f"{m.case.key}_vs_baseline"] = round(ratio, 3)
        target = TARGETS.get(m.case.key)
        if target is not None and ratio < target:
            summary["targets_missed"].append(m.case.key)
    summary["targets_met"] = not summary["targets_missed"]
    return summary


def print_table(summary: dict[str, Any]) -> None:
    """The summary as a readable table."""
    print(
        f"{summary['messages']} messages per case, handler: sleep "
        f"{summary['handler_seconds']:g} s then one row; prefetch "
        f"{summary['prefetch_factor']} x concurrency"
    )
    header = f"{'case':44} {'prefetch':>8} {'seconds':>8} {'msg/s':>8} {'x c1':>6}  target"
    print(header)
    print("-" * len(header))
    for key, c in summary["cases"].items():
        target = TARGETS.get(key)
        verdict = ""
        if target is not None:
            verdict = f">= {target:g}  " + ("ok" if key not in summary["targets_missed"] else "")
            if key in summary["targets_missed"]:
                verdict += "TARGET MISSED"
        print(
            f"{c['label']:44} {c['prefetch']:>8} {c['seconds']:>8.2f} {c['msg_s']:>8.2f} "
            f"{c['vs_baseline']:>6.2f}  {verdict}"
        )
    if summary["targets_met"]:
        print("targets met")
    else:
        print("target missed: " + ", ".join(summary["targets_missed"]))


def main() -> int:
    """The bench (or, with --worker, one of its consumer processes)."""
    parser = CommandParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=240, help="per case (default 240)")
    parser.add_argument(
        "--handler-seconds", type=float, default=0.2, help="the handler's sleep (default 0.2)"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="threads case (default 8)")
    parser.add_argument("--processes", type=int, default=4, help="process cases (default 4)")
    parser.add_argument(
        "--prefetch-factor",
        type=int,
        default=2,
        help="basic.qos prefetch = this x concurrency (default 2; must be >= 1)",
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES, help="an admin URL")
    parser.add_argument("--skip-postgres", action="store_true", help="leave out the PG case")
    parser.add_argument("--json", action="store_true", help="also print one JSON object")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(settings_from_env("amqp-lab bench-concurrency worker", heartbeat=60), args)
    if min(args.messages, args.concurrency, args.processes, args.prefetch_factor) < 1:
        parser.error("--messages, --concurrency, --processes and --prefetch-factor must be >= 1")
    if args.handler_seconds < 0:
        parser.error("--handler-seconds must be >= 0")
    settings = settings_from_env("amqp-lab bench-concurrency", heartbeat=60)
    if not args.skip_postgres:
        postgres_admin(args.postgres_url).close()  # fail now, not after minutes of SQLite cases
    results: list[Measured] = []
    todo = cases(args.processes, args.concurrency, args.skip_postgres)
    # a terminal's progress line on stderr: case i of n and its rows written; silent in a pipe
    progress = Progress("bench-concurrency", total=len(todo) * args.messages, unit="messages")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp, progress:
            for i, case in enumerate(todo):

                def on_rows(rows: int, i: int = i, label: str = case.label) -> None:
                    progress.update(i * args.messages + rows, f"case {i + 1}/{len(todo)}: {label}")

                on_rows(0)
                if case.store == "postgresql":
                    with postgres_store(args.postgres_url) as store:
                        m = measure(
                            settings,
                            case,
                            args.messages,
                            args.handler_seconds,
                            args.prefetch_factor,
                            store,
                            on_rows,
                        )
                else:
                    with sqlite_store(Path(tmp), case.key) as store:
                        m = measure(
                            settings,
                            case,
                            args.messages,
                            args.handler_seconds,
                            args.prefetch_factor,
                            store,
                            on_rows,
                        )
                results.append(m)
    finally:
        delete_queue(settings)
    summary = summarize(results, args)
    print_table(summary)
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    return EXIT_OK if results else EXIT_FAILED


if __name__ == "__main__":
    run(main)
