#!/usr/bin/env python3
"""Consume q:tasks with the lab handler: manual ack after the work, prefetch, dedup, DLQ records.

One line per delivery:
``message_id=<id> outcome=processed|duplicate|requeued|dead-lettered attempts=<n> redelivered=<b>``
"""

from __future__ import annotations

import argparse
import re

from _cli import EXIT_OK, ROOT, run, settings_from_env

from amqp_lab.consumer import Consumer, ConsumerConfig, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.lab import lab_handler
from amqp_lab.settings import BrokerSettings


def default_dedup_path(settings: BrokerSettings) -> str:
    """One SQLite file per broker and vhost, so fresh vhosts start with a fresh store."""
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{settings.host}-{settings.port}-{settings.vhost}")
    return str(ROOT / ".state" / f"dedup-{key}.sqlite3")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", default="q:tasks")
    parser.add_argument("--prefetch", type=int, default=10, help="basic.qos prefetch_count")
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="S",
        help="exit 0 after S seconds with nothing to do",
    )
    parser.add_argument("--max-messages", type=int, default=None, metavar="N")
    parser.add_argument(
        "--dead-letter",
        choices=["publish", "reject"],
        default="publish",
        help="publish a confirmed DLQ record (default) or basic.reject to the DLX",
    )
    parser.add_argument("--dedup-path", default=None, help="SQLite file of processed message_ids")
    parser.add_argument("--heartbeat", type=int, default=30, help="seconds")
    args = parser.parse_args()
    if args.prefetch < 1:
        parser.error("--prefetch must be >= 1")
    settings = settings_from_env("amqp-lab worker", heartbeat=args.heartbeat)
    store = SqliteDedupStore(args.dedup_path or default_dedup_path(settings))
    config = ConsumerConfig(
        queue=args.queue,
        prefetch=args.prefetch,
        dead_letter=args.dead_letter,
        idle_exit=args.idle_exit,
        max_messages=args.max_messages,
    )

    def report(r: DeliveryReport) -> None:
        print(r.line(), flush=True)

    try:
        handled = Consumer(settings, lab_handler, store, config, on_report=report).run()
    finally:
        store.close()
    print(f"worker done: {handled} deliveries handled")
    return EXIT_OK


if __name__ == "__main__":
    run(main)
