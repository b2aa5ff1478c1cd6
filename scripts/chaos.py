#!/usr/bin/env python3
"""Crash test: publish N messages, SIGKILL and restart workers, force-close connections, drain,
then check that every confirmed message_id was applied exactly once or dead-lettered.

    python scripts/chaos.py [--messages 2000] [--kills 5] [--workers 3] [--closes F]
                            [--dedup-url URL] [--unsafe-auto-ack] [--seed S] [--json]
    python scripts/chaos.py --cluster [--messages 2000] [--kills 5] ...   (docs/cluster.md)

With --cluster, EAI_AMQP_URL lists the nodes of a three-node cluster (scripts/cluster.py env)
and each of the F kills is a SIGKILL of the node that hosts the leader of quorum queue q:tasks,
while publishing and consuming, then a restart of that node (lab.chaos_cluster); the summary
adds, per kill, the consumers' resume time and the confirms outstanding at the kill and their
fate.

Each handler effect is one row in a ``ledger`` table in the dedup store's database, written in
the dedup transaction. With --json the last line is the summary object. Exit 0 when the
invariant holds (lost = 0, applied_twice = 0, redeliveries_seen > 0), 5 when it does not. With
--unsafe-auto-ack the workers consume with auto_ack=True and the run shows the loss that
design causes (exit 0: the loss is the expected contrast, printed, not hidden).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _cli import EXIT_OK, ROOT, run, settings_from_env

from amqp_lab.dedup import ManagedDedupStore, open_store, store_kind
from amqp_lab.dlq.ops import browse, depth
from amqp_lab.errors import ConfigurationError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, with_queue_type
from lab.chaos import (
    Event,
    OutputTally,
    create_ledger,
    invariant_holds,
    plan_events,
    read_ledger,
    summarize,
)
from lab.chaos_cluster import ClusterChaosPlan, check_addresses, run_cluster_chaos
from lab.chaos_pool import Closer, PublisherThread, WorkerPool, connection_name, wait_visible
from lab.chaos_worker import NAMES, QUEUE, run_worker
from lab.cluster import DEFAULT_NAME, Cluster

EXIT_INVARIANT = 5
STALL = 2.0  # seconds without a new delivery after publishing: fire the remaining events


def queue_depth(settings: BrokerSettings) -> int:
    """Ready messages in q:tasks (queue.declare passive: exact, no statistics lag)."""
    return depth(settings, QUEUE)


class ChaosRun:
    """One run: K workers, the publisher, the chaos events, the drain and the tally."""

    def __init__(
        self, args: argparse.Namespace, settings: BrokerSettings, run_id: str, workdir: Path
    ) -> None:
        self.args, self.settings, self.run_id = args, settings, run_id
        self.rng = random.Random(args.seed)
        self.started = time.monotonic()
        self.stop_file = workdir / "stop"
        self.tally = OutputTally()
        self.kills = 0
        command = [sys.executable, str(Path(__file__).resolve()), "--dedup-url", args.dedup_url]
        command += ["--run-id", self.run_id, "--stop-file", str(self.stop_file)]
        command += ["--work-ms", str(args.work_ms), "--ack-batch", str(args.ack_batch)]
        command += ["--unsafe-auto-ack"] if args.unsafe_auto_ack else []
        command += ["--prefetch", str(args.prefetch)] if args.prefetch else []
        self.pool = WorkerPool(args.workers, command, workdir)
        self.publisher = PublisherThread(
            settings_from_env(connection_name("publisher")),
            self.run_id,
            args.messages,
            args.duplicate_every,
            args.publish_rate,
        )
        self.closer = Closer(settings, self.publisher, self.pool.names, self.rng, self.log)

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def start(self) -> None:
        """Open the publisher's connection and wait until the management API lists it (so it
        can be force-closed mid-publishing), start publishing, and start the workers once a
        fifth of the messages is confirmed: the workers then start with a backlog, so a kill or a
        forced close catches deliveries in flight (prefetched, or auto-acked and buffered)."""
        self.publisher.start()
        self.closer.start()
        with ManagementClient(self.settings) as api:
            if not wait_visible(api, self.settings.vhost, [connection_name("publisher")], 60):
                self.log("warning: the publisher's connection did not show within 60 s")
        self.publisher.go.set()
        head_start = max(1, self.args.messages // 5)
        while len(self.publisher.confirmed) < head_start and self.publisher.is_alive():
            time.sleep(0.02)
        self.pool.start_all()
        self.log(
            f"{len(self.publisher.confirmed)} confirmed; {len(self.pool.names)} workers started"
        )

    def fire(self, event: Event) -> str:
        """Carry out one chaos event (closes happen in the background); describe it."""
        if event.kind == "kill":
            name = self.rng.choice(self.pool.busy(within=0.5) or self.pool.names)
            self.kills += 1
            return f"SIGKILL {name} (pid {self.pool.kill(name, self.rng)}), restarted"
        target = "publisher" if event.kind == "close-publisher" else "worker"
        self.closer.request(target)
        return f"force-close a {target} connection"

    def chaos_phase(self, events: list[Event]) -> None:
        """Fire each event at its progress point: deliveries seen (kills, worker closes) or
        messages confirmed (publisher closes); when progress stalls, fire what is left."""
        last_seen, last_change = -1, time.monotonic()
        while events or self.publisher.is_alive():
            seen = self.tally.update(self.pool.outputs)
            if seen != last_seen:
                last_seen, last_change = seen, time.monotonic()
            for line in self.pool.restart_exited():
                self.log(line)
            stalled = not self.publisher.is_alive() and time.monotonic() - last_change > STALL
            confirmed = len(self.publisher.confirmed)
            for event in events:
                progress = confirmed if event.kind == "close-publisher" else seen
                if progress >= event.at or stalled:
                    events.remove(event)
                    self.log(f"{self.fire(event)} (confirmed={confirmed} deliveries={seen})")
                    last_change = time.monotonic()
                    break
            time.sleep(0.05)
        self.closer.finish()

    def drain(self) -> int:
        """Stop file, wait until every worker exited idle, start them again while q:tasks still
        holds messages. Returns the messages left (0 when drained)."""
        self.log("draining")
        return self.pool.drain(self.stop_file, lambda: queue_depth(self.settings))

    def summary(self, store: ManagedDedupStore, left: int) -> dict[str, Any]:
        self.tally.update(self.pool.outputs)
        dlq_ids = [e.message_id for e in browse(self.settings, NAMES.dlq) if e.message_id]
        counts = self.tally.counts
        summary: dict[str, Any] = summarize(
            self.publisher.confirmed,
            read_ledger(store, self.run_id),
            dlq_ids,
            counts["redelivered"],
        )
        summary.update(
            mode="unsafe-auto-ack" if self.args.unsafe_auto_ack else "safe",
            store=store_kind(self.args.dedup_url)[0],
            workers=self.args.workers,
            kills=self.kills,
            worker_closes=self.closer.closed["worker"],
            publisher_closes=self.closer.closed["publisher"],
            publish_retries=self.publisher.attempts - self.publisher.sent,
            publish_failed=len(self.publisher.failed),
            duplicates_skipped=counts["outcome:duplicate"],
            deliveries=counts["deliveries"],
            unexpected_worker_exits=self.pool.unexpected_exits,
            left_in_queue=left,
            seconds=round(time.monotonic() - self.started, 1),
        )
        summary["invariant_holds"] = invariant_holds(summary)
        return summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, metavar="N")
    parser.add_argument("--kills", type=int, default=5, metavar="F", help="SIGKILL + restart")
    parser.add_argument("--workers", type=int, default=3, metavar="K")
    parser.add_argument("--closes", type=int, default=None, help="forced closes (default: F)")
    parser.add_argument("--dedup-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--unsafe-auto-ack", action="store_true", help="show the loss")
    parser.add_argument("--duplicate-every", type=int, default=10, metavar="D")
    parser.add_argument("--work-ms", type=float, default=20.0, help="handler work per message")
    parser.add_argument("--publish-rate", type=float, default=0.0, help="messages/s; 0: no cap")
    parser.add_argument(
        "--ack-batch",
        type=int,
        default=1,
        metavar="B",
        help="deliveries per store transaction and basic.ack multiple=true (prefetch 2*B)",
    )
    parser.add_argument("--prefetch", type=int, default=None, help="default 10; --cluster: 1")
    parser.add_argument("--seed", type=int, default=None, help="for the event plan")
    cluster = parser.add_argument_group("--cluster: kill quorum queue leaders (docs/cluster.md)")
    cluster.add_argument("--cluster", action="store_true", help="leader kills, not worker kills")
    cluster.add_argument("--cluster-name", default=DEFAULT_NAME, help="as scripts/cluster.py's")
    cluster.add_argument("--cluster-size", type=int, default=3)
    cluster.add_argument("--cluster-amqp-port", type=int, default=5701, help="node 1's")
    cluster.add_argument("--cluster-management-port", type=int, default=15701, help="node 1's")
    cluster.add_argument("--window", type=int, default=50, help="unconfirmed publishes at most")
    parser.add_argument("--json", action="store_true", help="last line: the JSON summary")
    parser.add_argument("--worker-process", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-id", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.messages < 1 or args.workers < 1 or min(args.kills, args.duplicate_every) < 0:
        parser.error("--messages and --workers must be >= 1, --kills and --duplicate-every >= 0")
    if args.closes is not None and args.closes < 0:
        parser.error("--closes must be >= 0")
    if args.prefetch is not None and args.prefetch < args.ack_batch:
        parser.error("--prefetch must be >= --ack-batch")
    if args.cluster and (args.unsafe_auto_ack or args.closes or args.ack_batch != 1):
        parser.error("--cluster kills leaders only: no --unsafe-auto-ack, --closes, --ack-batch")
    if args.cluster and (args.kills < 1 or args.window < 1):
        parser.error("--cluster needs --kills >= 1 and --window >= 1")
    if args.cluster and args.messages < 10 * (args.kills + 1):
        parser.error("--cluster needs --messages >= 10 * (--kills + 1): a portion per kill")
    return args


def main() -> int:
    args = parse_args()
    if args.worker_process:
        return run_worker(
            settings_from_env(connection_name(args.worker_process)),
            args.dedup_url,
            args.run_id,
            args.worker_process,
            Path(args.stop_file),
            args.unsafe_auto_ack,
            args.work_ms / 1000,
            prefetch=args.prefetch,
            ack_batch=args.ack_batch,
        )
    if args.cluster:
        return cluster_main(args)
    settings = settings_from_env("amqp-lab chaos")
    apply_topology(settings, load_topology())
    run_id, workdir = prepare_run(settings, args)
    store = open_store(args.dedup_url)
    chaos = ChaosRun(args, settings, run_id, workdir)
    try:
        create_ledger(store)
        closes = args.kills if args.closes is None else args.closes
        chaos.log(
            f"run {chaos.run_id}: {'unsafe auto-ack' if args.unsafe_auto_ack else 'safe'}, "
            f"{args.messages} messages, {args.workers} workers, {args.kills} kills, "
            f"{closes} forced closes, store {store.location}"
        )
        chaos.start()
        chaos.chaos_phase(plan_events(chaos.rng, args.messages, args.kills, closes))
        summary = chaos.summary(store, chaos.drain())
    finally:
        chaos.pool.kill_all()
        store.close()
    for key, value in summary.items():
        print(f"{key}={value}")
    holds = summary["invariant_holds"]
    if args.unsafe_auto_ack:
        print(
            f"CONTRAST: with auto-ack, {summary['lost']} of {summary['published_confirmed']} "
            "confirmed messages were lost: the broker forgot each one when it sent it, and the "
            "killed or disconnected workers died holding them"
        )
    elif not holds:
        print(f"INVARIANT VIOLATED; worker output and store kept in {workdir}")
    if holds or args.unsafe_auto_ack:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    return EXIT_OK if holds or args.unsafe_auto_ack else EXIT_INVARIANT


def prepare_run(settings: BrokerSettings, args: argparse.Namespace) -> tuple[str, Path]:
    """Refuse a q:tasks that is not empty; the run id and its work directory (in .state/)."""
    if queue_depth(settings):
        raise ConfigurationError(
            f"q:tasks in vhost {settings.vhost!r} is not empty; the crash test needs it empty"
        )
    (ROOT / ".state").mkdir(exist_ok=True)
    run_id = f"chaos-{uuid.uuid4().hex[:10]}"
    workdir = Path(tempfile.mkdtemp(prefix=f"{run_id}-", dir=ROOT / ".state"))
    args.dedup_url = args.dedup_url or str(workdir / "dedup.sqlite3")
    return run_id, workdir


def cluster_main(args: argparse.Namespace) -> int:
    """The --cluster run: quorum topology, leader kills (lab.chaos_cluster), the summary."""
    cluster = Cluster(
        size=args.cluster_size,
        name=args.cluster_name,
        amqp_port=args.cluster_amqp_port,
        management_port=args.cluster_management_port,
    )
    settings = settings_from_env("amqp-lab chaos")
    check_addresses(settings, [n.amqp_url(settings.vhost) for n in cluster.nodes])
    apply_topology(settings, with_queue_type(load_topology(), "quorum"))
    run_id, workdir = prepare_run(settings, args)
    store = open_store(args.dedup_url)
    portion = args.messages // (args.kills + 1)
    plan = ClusterChaosPlan(
        args.messages,
        args.kills,
        args.workers,
        args.duplicate_every,
        args.publish_rate or max(10.0, portion / 3),  # a portion takes about 3 s
        args.window,
    )
    command = [sys.executable, str(Path(__file__).resolve()), "--dedup-url", args.dedup_url]
    command += ["--run-id", run_id, "--stop-file", str(workdir / "stop")]
    command += ["--work-ms", str(args.work_ms), "--prefetch", str(args.prefetch or 1)]
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)

    try:
        create_ledger(store)
        log(
            f"run {run_id}: cluster {args.cluster_name}, {args.messages} messages at most "
            f"{plan.rate:g}/s, {args.workers} workers, {args.kills} leader kills, "
            f"store {store.location}"
        )
        summary = run_cluster_chaos(cluster, settings, store, plan, command, run_id, workdir, log)
        summary["store"] = store_kind(args.dedup_url)[0]
    finally:
        store.close()
    for key, value in summary.items():
        if key != "failovers":
            print(f"{key}={value}")
    for i, kill in enumerate(summary["failovers"], 1):
        print(f"kill {i}: " + " ".join(f"{k}={v}" for k, v in kill.items()))
    if summary["invariant_holds"]:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"INVARIANT VIOLATED; worker output and store kept in {workdir}")
    if args.json:
        print(json.dumps(summary))
    return EXIT_OK if summary["invariant_holds"] else EXIT_INVARIANT


if __name__ == "__main__":
    run(main)
