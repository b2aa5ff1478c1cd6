#!/usr/bin/env python3
"""Crash test: publish N messages, SIGKILL and restart workers, force-close connections, drain,
then check that every confirmed message_id was applied exactly once or dead-lettered.

    python scripts/chaos.py [--messages 2000] [--kills 5] [--workers 3] [--closes F]
                            [--dedup-url URL] [--unsafe-auto-ack] [--seed S] [--json]
    python scripts/chaos.py --cluster [--messages 2000] [--kills 5] ...   (docs/cluster.md)
    python scripts/chaos.py --cluster --partition [--partitions 2] [--pauses 2]
                            [--heartbeat S] [--confirm-timeout S] ...     (docs/cluster.md)
    python scripts/chaos.py --ordered [--keys 50] [--shards 4] [--fail-every 7] ...
                                                                          (docs/ordering.md)
    python scripts/chaos.py --outbox [--store postgresql|sqlite] [--messages N] [--keys K]
                            [--producers P] [--relays R] [--workers W] [--rounds N]
                                                                          (docs/outbox.md)

With --outbox, producers commit rows with outbox messages (some rolled back, scheduled,
cancelled), stage A applies them and emits follow-ups through its outbox to stage B; relays and
workers are SIGKILLed, PostgreSQL and the broker (the run's own) restarted. lost, phantom,
applied_twice, out_of_order and scheduled_early must be 0 (lab.chaos_outbox_run).

With --ordered, the N messages go over K keys through the ordered topology (each body carries
its key and per-key seq, message_id KEY-SEQ), the workers are ordered consumers subscribed to
every shard (single active consumer), every message whose seq % fail-every == 3 fails
transiently on its first try, and the invariant adds per-key order: every key's effects are
applied in seq order (out_of_order = 0).

With --cluster, EAI_AMQP_URL lists the nodes of a three-node cluster (scripts/cluster.py env)
and each of the F kills is a SIGKILL of the node that hosts the leader of quorum queue q:tasks,
while publishing and consuming, then a restart of that node (lab.chaos_cluster); the summary
adds, per kill, the consumers' resume time and the confirms outstanding at the kill and their
fate.

With --cluster --partition, the faults are network partitions instead: P times one node's
container is cut off the cluster network (docker network disconnect, then connect), Z times
one is frozen (docker pause, then unpause), alternating, on the nodes that matter (the leader
of q:tasks, the publisher's node, a consumer's node), each held as long as the cluster's
failure-detection timers need (lab.partitions, lab.chaos_partition); the summary adds, per
fault, when the other nodes declared the node down, the confirms refused on its side (nacked,
timed out, lost) and the time until confirms and deliveries flowed again.

Each handler effect is one row in a ``ledger`` table in the dedup store's database, written in
the dedup transaction. With --json the last line is the summary object. Exit 0 when the
invariant holds (lost = 0, applied_twice = 0, redeliveries_seen > 0), 5 when it does not. With
--unsafe-auto-ack the workers consume with auto_ack=True and the run shows the loss that
design causes (exit 0: the loss is the expected contrast, printed, not hidden).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _cli import EXIT_OK, ROOT, run, settings_from_env

from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.progress import Progress
from amqp_lab.dedup import ManagedDedupStore, open_store
from amqp_lab.dlq.ops import depth
from amqp_lab.errors import ConfigurationError
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, with_queue_type
from amqp_lab.topology.ordered import with_ordered
from lab.chaos import create_ledger, plan_events
from lab.chaos_cluster import ClusterChaosPlan, check_addresses, run_cluster_chaos
from lab.chaos_ordered_run import OrderedChaosRun
from lab.chaos_ordered_worker import FirstTryFaults, run_ordered_worker
from lab.chaos_outbox_run import OutboxChaosPlan, run_outbox_chaos
from lab.chaos_partition import plan_faults, run_partition_chaos
from lab.chaos_pool import connection_name
from lab.chaos_run import ChaosPlan, ChaosRun
from lab.chaos_worker import QUEUE, run_worker
from lab.cluster import DEFAULT_NAME, Cluster

EXIT_INVARIANT = 5


def queue_depth(settings: BrokerSettings) -> int:
    """Ready messages in q:tasks (queue.declare passive: exact, no statistics lag)."""
    return depth(settings, QUEUE)


def parse_args() -> argparse.Namespace:
    parser = CommandParser(description=__doc__.splitlines()[0])
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
    cluster.add_argument("--partition", action="store_true", help="partitions and pauses")
    cluster.add_argument("--partitions", type=int, default=2, metavar="P", help="network cuts")
    cluster.add_argument("--pauses", type=int, default=2, metavar="Z", help="docker pause")
    cluster.add_argument("--heartbeat", type=int, default=None, help="clients' (default 30 s)")
    cluster.add_argument("--confirm-timeout", type=float, default=30.0, metavar="S")
    ordered = parser.add_argument_group("--ordered: per-key order (docs/ordering.md)")
    ordered.add_argument("--ordered", action="store_true", help="keyed messages, ordered workers")
    ordered.add_argument("--keys", type=int, default=50, metavar="K")
    ordered.add_argument("--shards", type=int, default=4, metavar="S")
    ordered.add_argument(
        "--fail-every", type=int, default=7, metavar="E", help="seq %% E == 3 fails once; 0: none"
    )
    outbox = parser.add_argument_group("--outbox: the transactional outbox (docs/outbox.md)")
    outbox.add_argument("--outbox", action="store_true", help="outbox producers, two stages")
    outbox.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    outbox.add_argument("--producers", type=int, default=3, metavar="P")
    outbox.add_argument("--relays", type=int, default=2, metavar="R")
    outbox.add_argument("--rounds", type=int, default=1, help="rounds of the five events")
    outbox.add_argument("--drain-timeout", type=float, default=120.0, metavar="S")
    parser.add_argument("--json", action="store_true", help="last line: the JSON summary")
    parser.add_argument("--worker-process", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-id", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--faults-file", default=None, help=argparse.SUPPRESS)
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
    if args.partition and (not args.cluster or min(args.partitions, args.pauses) < 0):
        parser.error("--partition needs --cluster, --partitions >= 0 and --pauses >= 0")
    if args.partition and (args.partitions + args.pauses < 1 or args.confirm_timeout <= 0):
        parser.error(
            "--partition needs a fault (--partitions + --pauses >= 1), --confirm-timeout > 0"
        )
    if (args.heartbeat is not None and args.heartbeat < 1) or (args.heartbeat and not args.cluster):
        parser.error("--heartbeat goes with --cluster and is >= 1 second")
    if args.cluster and not args.partition and args.messages < 10 * (args.kills + 1):
        parser.error("--cluster needs --messages >= 10 * (--kills + 1): a portion per kill")
    if args.partition and args.messages < 10 * (args.partitions + args.pauses + 1):
        parser.error("--partition needs --messages >= 10 * (--partitions + --pauses + 1)")
    if args.ordered and (args.cluster or args.unsafe_auto_ack or args.ack_batch != 1):
        parser.error("--ordered: no --cluster, --unsafe-auto-ack or --ack-batch")
    if args.ordered and (args.keys < 1 or args.fail_every < 0 or not 1 <= args.shards <= 1000):
        parser.error("--ordered needs --keys >= 1, --shards 1..1000, --fail-every >= 0")
    return args


def main() -> int:
    args = parse_args()
    if args.worker_process and args.ordered:
        return run_ordered_worker(
            settings_from_env(connection_name(args.worker_process)),
            args.dedup_url,
            Path(args.faults_file),
            args.run_id,
            args.worker_process,
            Path(args.stop_file),
            args.shards,
            args.fail_every,
            args.work_ms / 1000,
        )
    if args.worker_process:
        heartbeat = {"heartbeat": args.heartbeat} if args.heartbeat else {}
        return run_worker(
            settings_from_env(connection_name(args.worker_process), **heartbeat),
            args.dedup_url,
            args.run_id,
            args.worker_process,
            Path(args.stop_file),
            args.unsafe_auto_ack,
            args.work_ms / 1000,
            prefetch=args.prefetch,
            ack_batch=args.ack_batch,
            stay=args.partition,
        )
    if args.outbox:
        return outbox_main(args)
    if args.cluster:
        return cluster_main(args)
    if args.ordered:
        return ordered_main(args)
    settings = settings_from_env("amqp-lab chaos")
    apply_topology(settings, load_topology())
    run_id, workdir = prepare_run(settings, args)
    store = open_store(args.dedup_url)
    command = [sys.executable, str(Path(__file__).resolve()), "--dedup-url", args.dedup_url]
    command += ["--run-id", run_id, "--stop-file", str(workdir / "stop")]
    command += ["--work-ms", str(args.work_ms), "--ack-batch", str(args.ack_batch)]
    command += ["--unsafe-auto-ack"] if args.unsafe_auto_ack else []
    command += ["--prefetch", str(args.prefetch)] if args.prefetch else []
    plan = ChaosPlan(
        args.messages,
        args.kills,
        args.workers,
        args.duplicate_every,
        args.publish_rate,
        args.unsafe_auto_ack,
        args.seed,
    )
    progress = Progress("chaos", total=args.messages, unit="confirmed")
    chaos = ChaosRun(plan, settings, run_id, workdir, command, progress)
    closes = args.kills if args.closes is None else args.closes
    summary = run_chaos(
        chaos,
        store,
        args,
        f"run {chaos.run_id}: {'unsafe auto-ack' if args.unsafe_auto_ack else 'safe'}, "
        f"{args.messages} messages, {args.workers} workers, {args.kills} kills, "
        f"{closes} forced closes, store {store.location}",
    )
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
        print(json.dumps(summary, allow_nan=False))
    return EXIT_OK if holds or args.unsafe_auto_ack else EXIT_INVARIANT


def run_chaos(
    chaos: ChaosRun, store: ManagedDedupStore, args: argparse.Namespace, description: str
) -> dict[str, Any]:
    """Ledger, workers, the kills and closes of the event plan, drain; the summary, printed
    one ``key=value`` per line. The workers are killed and the store closed either way; the
    progress line (a terminal's) is gone before the summary."""
    try:
        create_ledger(store)
        closes = args.kills if args.closes is None else args.closes
        chaos.log(description)
        chaos.start()
        chaos.chaos_phase(plan_events(chaos.rng, args.messages, args.kills, closes))
        summary = chaos.summary(store, chaos.drain())
    finally:
        if chaos.progress is not None:
            chaos.progress.clear()
        chaos.pool.kill_all()
        store.close()
    for key, value in summary.items():
        print(f"{key}={value}")
    return summary


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


def ordered_main(args: argparse.Namespace) -> int:
    """The --ordered run: ordered topology, ordered workers, kills and closes, the per-key order
    summary (lab.chaos_ordered_run)."""
    settings = settings_from_env("amqp-lab chaos")
    topology = with_ordered(load_topology(), shards=args.shards)
    apply_topology(settings, topology)
    if any(depth(settings, q) for q in topology.names.shard_queues):
        raise ConfigurationError(
            f"a shard queue in vhost {settings.vhost!r} is not empty; the crash test needs "
            "them empty"
        )
    run_id, workdir = prepare_run(settings, args)
    faults = workdir / "faults.sqlite3"
    store = open_store(args.dedup_url)
    command = [sys.executable, str(Path(__file__).resolve()), "--ordered", "--dedup-url"]
    command += [args.dedup_url, "--run-id", run_id, "--stop-file", str(workdir / "stop")]
    command += ["--work-ms", str(args.work_ms), "--shards", str(args.shards)]
    command += ["--fail-every", str(args.fail_every), "--faults-file", str(faults)]
    plan = ChaosPlan(
        args.messages,
        args.kills,
        args.workers,
        args.duplicate_every,
        args.publish_rate,
        seed=args.seed,
    )
    FirstTryFaults(faults).close()  # the table, before any worker or the summary reads it
    progress = Progress("chaos --ordered", total=args.messages, unit="confirmed")
    chaos = OrderedChaosRun(
        plan, settings, run_id, workdir, command, args.keys, args.shards, faults, progress
    )
    closes = args.kills if args.closes is None else args.closes
    summary = run_chaos(
        chaos,
        store,
        args,
        f"run {run_id}: ordered, {args.messages} messages over {args.keys} keys, "
        f"{args.shards} shards, {args.workers} workers, {args.kills} kills, {closes} forced "
        f"closes, seq % {args.fail_every} == 3 fails once, store {store.location}",
    )
    holds = summary["invariant_holds"]
    if holds:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"INVARIANT VIOLATED; worker output and store kept in {workdir}")
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    return EXIT_OK if holds else EXIT_INVARIANT


def outbox_main(args: argparse.Namespace) -> int:
    """The --outbox run (lab.chaos_outbox_run): a broker and a database of its own."""
    (ROOT / ".state").mkdir(exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="chaos-outbox-", dir=ROOT / ".state"))
    plan = OutboxChaosPlan(
        args.store,
        args.messages,
        args.keys,
        args.producers,
        args.relays,
        args.workers,
        args.shards,
        args.rounds,
        drain_timeout=args.drain_timeout,
        seed=args.seed,
    )
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)

    summary = run_outbox_chaos(plan, workdir, log)
    for key, value in summary.items():
        print(f"{key}={value}")
    if summary["invariant_holds"]:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"INVARIANT VIOLATED; processes' output and databases kept in {workdir}")
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    return EXIT_OK if summary["invariant_holds"] else EXIT_INVARIANT


def cluster_main(args: argparse.Namespace) -> int:
    """The --cluster run: quorum topology, leader kills (lab.chaos_cluster) or, with
    --partition, partitions and pauses (lab.chaos_partition); the summary."""
    cluster = Cluster(
        size=args.cluster_size,
        name=args.cluster_name,
        amqp_port=args.cluster_amqp_port,
        management_port=args.cluster_management_port,
    )
    heartbeat = {"heartbeat": args.heartbeat} if args.heartbeat else {}
    settings = settings_from_env("amqp-lab chaos", **heartbeat)
    check_addresses(settings, [n.amqp_url(settings.vhost) for n in cluster.nodes])
    faults = (
        plan_faults(cluster, settings.heartbeat, args.partitions, args.pauses, args.confirm_timeout)
        if args.partition
        else None
    )
    apply_topology(settings, with_queue_type(load_topology(), "quorum"))
    run_id, workdir = prepare_run(settings, args)
    store = open_store(args.dedup_url)
    portion = args.messages // ((len(faults.steps) if faults else args.kills) + 1)
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
    command += ["--cluster", "--heartbeat", str(args.heartbeat)] if args.heartbeat else []
    command += ["--cluster", "--partition"] if faults else []
    started = time.monotonic()
    progress = Progress("chaos --cluster", total=args.messages, unit="handed over")

    def log(text: str) -> None:
        progress.clear()  # the log line starts at column 0, not after the progress
        print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)

    try:
        create_ledger(store)
        what = faults.describe() if faults else f"{args.kills} leader kills"
        log(
            f"run {run_id}: cluster {args.cluster_name}, {args.messages} messages at most "
            f"{plan.rate:g}/s, {args.workers} workers, {what}, store {store.location}"
        )
        run_args = (command, run_id, workdir, log, progress)
        if faults:
            summary = run_partition_chaos(cluster, settings, store, plan, faults, *run_args)
        else:
            summary = run_cluster_chaos(cluster, settings, store, plan, *run_args)
        summary["store"] = store.dialect
    finally:
        progress.clear()
        store.close()
    events = "events" if args.partition else "failovers"
    for key, value in summary.items():
        if key != events:
            print(f"{key}={value}")
    for i, event in enumerate(summary[events], 1):
        name = event["kind"] if args.partition else "kill"
        print(f"{name} {i}: " + " ".join(f"{k}={v}" for k, v in event.items() if k != "kind"))
    if summary["invariant_holds"]:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"INVARIANT VIOLATED; worker output and store kept in {workdir}")
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    return EXIT_OK if summary["invariant_holds"] else EXIT_INVARIANT


if __name__ == "__main__":
    run(main)
