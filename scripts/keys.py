#!/usr/bin/env python3
"""The key distribution of ordered traffic: each shard's share, the top keys' shares, and a
WARN line (exit 2) for a hot key, a hot shard or too few keys (docs/ordering.md).

  keys.py report --sample FILE   keys from a file (one per line, or JSON lines: --field)
  keys.py report --dlq | --audit keys from the DLQ / audit queue's `key` headers (not consumed)
  keys.py report --live          the real shard queues' depth and publish rate (management API)
  keys.py sample --keys K --messages N --zipf S --out FILE   a seeded skewed sample

Key -> shard placement comes from a probe on the broker (same ring as the real exchange when
its shard queues were bound in order with the same weight), or --offline: crc32 mod N.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _cli import (
    EXIT_ALERT,
    EXIT_FAILED,
    EXIT_OK,
    ROOT,
    add_topology_option,
    run,
    settings_from_env,
    topology_from,
)

from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.state import default_dedup_path
from amqp_lab.dedup import open_store
from amqp_lab.dedup.identity import check_vhost
from amqp_lab.dlq.record import utc_iso
from amqp_lab.errors import ConfigurationError
from amqp_lab.management import ManagementClient
from amqp_lab.oneline import one_line
from amqp_lab.ordering.consumer import parked_scope
from amqp_lab.ordering.distribution import (
    DEFAULT_KEY_THRESHOLD,
    Distribution,
    Thresholds,
    analyze,
    analyze_shard_counts,
)
from amqp_lab.ordering.key_sources import (
    SHARD_QUEUE_TEMPLATE,
    HeaderKeys,
    dlq_keys,
    parse_sample,
    queue_keys,
    shard_stats,
    zipf_sample,
)
from amqp_lab.ordering.parking import ParkedKeys
from amqp_lab.ordering.probe import (
    DEFAULT_SHARDS,
    DEFAULT_WEIGHT,
    offline_placement,
    probe_placement,
)
from amqp_lab.topology import DEFAULT_TOPOLOGY, load_topology
from amqp_lab.topology.ordered import with_ordered

BAR = 40


def print_report(report: Distribution, placement: str) -> None:
    if report.distinct_keys is not None:
        print(
            f"{report.messages:g} messages, {report.distinct_keys} distinct keys, "
            f"{report.shards} shards"
            + (
                f", {report.unkeyed} without a usable key header (not counted)"
                if report.unkeyed
                else ""
            )
        )
    print(f"placement: {placement}")
    if report.shard_shares:
        print(f"{'shard':>5} {'messages':>10} {'share':>7} {'keys':>6}")
        for s in report.shard_shares:
            keys = "-" if s.keys is None else str(s.keys)
            bar = "#" * round(s.share * BAR)
            print(f"{s.shard:>5} {s.count:>10g} {s.share:>7.1%} {keys:>6}  {bar}")
    if report.top_keys:
        print(f"top {len(report.top_keys)} keys:")
        for k in report.top_keys:
            shard = "-" if k.shard is None else str(k.shard)
            print(f"  {k.count:>8} {k.share:>7.1%}  shard {shard:>3}  {one_line(k.key)}")
    for w in report.warnings:
        print(f"WARN {w.kind}: {one_line(w.text)}")


def report_command(args: argparse.Namespace) -> int:
    thresholds = Thresholds(key_threshold=args.key_threshold, shard_threshold=args.shard_threshold)
    if args.live:
        settings = settings_from_env("amqp-lab keys")
        with ManagementClient(settings) as api:
            stats = shard_stats(api, settings.vhost, args.shards, args.shard_queue)
        rates = [s.publish_rate for s in stats]
        by_rate = sum(rates) > 0
        counts = rates if by_rate else [float(s.messages) for s in stats]
        report = analyze_shard_counts(counts, thresholds=thresholds)
        what = "publish rate (msg/s)" if by_rate else "queue depth (messages)"
        label = f"live: the real queues {args.shard_queue.format(n='N')} by {what}"
    else:
        found = read_keys(args)
        if args.offline:
            placement = offline_placement(found.keys, args.shards)
        else:
            settings = settings_from_env("amqp-lab keys probe")
            placement = probe_placement(settings, found.keys, args.shards, args.weight)
        report = analyze(
            found.keys,
            placement.shard_of,
            args.shards,
            top=args.top,
            thresholds=thresholds,
            unkeyed=found.unkeyed,
        )
        label = placement.note
    if args.json:
        print(json.dumps({"placement": label, **report.as_dict()}, sort_keys=True, allow_nan=False))
    else:
        print_report(report, label)
    return EXIT_ALERT if report.hot else EXIT_OK


def read_keys(args: argparse.Namespace) -> HeaderKeys:
    if args.sample is not None:
        path = Path(args.sample)
        try:
            with path.open("rb") as f:
                keys = parse_sample(f, field=args.field, fmt=args.format, name=str(path))
        except OSError as e:
            raise ConfigurationError(f"cannot read {path}: {e.strerror}") from e
        return HeaderKeys(tuple(keys), 0)
    settings = settings_from_env("amqp-lab keys")
    names = topology_from(args).names
    if args.dlq:
        return dlq_keys(settings, args.queue or names.dlq, args.limit)
    queue = args.queue or names.audit_queue
    if queue is None:
        raise ConfigurationError("the topology has no audit queue: name one with --queue")
    return queue_keys(settings, queue, args.limit)


def sample_command(args: argparse.Namespace) -> int:
    keys = zipf_sample(args.keys, args.messages, args.zipf, args.seed)
    text = "".join(f"{k}\n" for k in keys)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"{len(keys)} keys over {args.keys} distinct (zipf {args.zipf:g}) in {args.out}")
    return EXIT_OK


def parked_command(args: argparse.Namespace) -> int:
    """List the parked keys of the ordered topology (worker.py --ordered N
    --after-dead-letter park) in a worker's dedup store, or --release one: its later messages
    run again at once, and what is in the DLQ stays there (replay.py --key KEY replays it;
    replaying the blocker releases the key by itself). For a key whose blocker record was
    deleted, --release is the only way out."""
    settings = settings_from_env("amqp-lab keys")  # the vhost scopes the parked keys
    scope = parked_scope(settings.vhost, with_ordered(load_topology(Path(args.topology))).names)
    url = args.dedup_url or args.dedup_path or default_dedup_path(settings, ROOT / ".state")
    store = open_store(url)
    try:
        check_vhost(store, settings.vhost)  # another vhost's store holds none of our keys
        parked = ParkedKeys(store, scope)
        if args.release is not None:
            if parked.blocker(args.release) is None:
                print(f"key {args.release!r} is not parked (scope {scope})")
                return EXIT_FAILED
            parked.release(args.release)
            print(f"key {args.release!r} released (scope {scope})")
            return EXIT_OK
        rows = parked.all()
        for row in rows:
            print(
                f"key={one_line(row.key)} blocker={one_line(row.message_id)} "
                f"parked_at={utc_iso(row.parked_at)}"
            )
        print(f"{len(rows)} parked key(s) in scope {scope}")
    finally:
        store.close()
    return EXIT_OK


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="the distribution report (exit 2 on a warning)")
    add_topology_option(report)
    source = report.add_mutually_exclusive_group(required=True)
    source.add_argument("--sample", metavar="FILE", help="one key per line, or JSON lines")
    source.add_argument("--dlq", action="store_true", help="the DLQ's key headers")
    source.add_argument("--audit", action="store_true", help="the audit queue's key headers")
    source.add_argument("--live", action="store_true", help="the real shard queues' stats")
    report.add_argument("--field", default="key", help="JSON lines: the key's field (key)")
    report.add_argument("--format", choices=("auto", "lines", "jsonl"), default="auto")
    report.add_argument("--queue", default=None, help="--dlq/--audit: another queue to read")
    report.add_argument("--limit", type=int, default=None, help="--dlq/--audit: at most N")
    report.add_argument("--shards", type=int, default=DEFAULT_SHARDS, metavar="N")
    report.add_argument("--weight", type=int, default=DEFAULT_WEIGHT, metavar="W")
    report.add_argument("--shard-queue", default=SHARD_QUEUE_TEMPLATE, metavar="TEMPLATE")
    report.add_argument("--top", type=int, default=10, metavar="K")
    report.add_argument("--key-threshold", type=float, default=DEFAULT_KEY_THRESHOLD, metavar="F")
    report.add_argument(
        "--shard-threshold",
        type=float,
        default=None,
        metavar="F",
        help="a shard's share that warns (default 1.5 x 1/N)",
    )
    report.add_argument("--json", action="store_true", help="one JSON object")
    report.add_argument(
        "--offline", action="store_true", help="place keys by crc32 mod N, without a broker"
    )
    parked = commands.add_parser("parked", help="list parked keys, or --release one")
    parked.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="FILE")
    parked.add_argument("--dedup-url", default=None, help="the workers' store (PostgreSQL URL)")
    parked.add_argument("--dedup-path", default=None, help="the workers' SQLite store")
    parked.add_argument("--release", default=None, metavar="KEY")
    sample = commands.add_parser("sample", help="write a seeded Zipf-skewed sample")
    sample.add_argument("--keys", type=int, default=200, metavar="K")
    sample.add_argument("--messages", type=int, default=5000, metavar="N")
    sample.add_argument("--zipf", type=float, default=1.2, metavar="S", help="0: uniform")
    sample.add_argument("--seed", type=int, default=1)
    sample.add_argument("--out", default="-", metavar="FILE")
    args = parser.parse_args()
    if args.command == "sample":
        return sample_command(args)
    if args.command == "parked":
        return parked_command(args)
    if args.live and args.offline:
        parser.error("--offline places keys; --live has none to place")
    return report_command(args)


if __name__ == "__main__":
    run(main)
