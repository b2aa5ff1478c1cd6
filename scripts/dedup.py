#!/usr/bin/env python3
"""Look after the de-duplication store: purge expired records, show what it holds.

    python scripts/dedup.py purge [--older-than-days 7] [--replay-window-days 3] [--dedup-url URL]
    python scripts/dedup.py stats [--dedup-url URL]

The store defaults to the worker's SQLite file for EAI_AMQP_URL's broker and vhost. ``purge``
refuses an age that is not longer than the longest retry horizon the topology allows (every
wait queue at its message-ttl: 9 x 300 s for the default one) plus the replay window: a copy
arriving later would be applied twice.
"""

from __future__ import annotations

import time

from _cli import EXIT_OK, ROOT, add_topology_option, run, settings_from_env, topology_from

from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.state import default_dedup_path
from amqp_lab.dedup import open_store
from amqp_lab.dedup.retention import (
    DAY,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_RETENTION,
    check_retention,
    cutoff,
)
from amqp_lab.dlq.record import utc_iso
from amqp_lab.retry.policy import RetryPolicy
from amqp_lab.topology import Topology


def longest_policy(topology: Topology) -> RetryPolicy:
    """The longest horizon any worker on ``topology`` can have: every wait queue at its TTL."""
    cap = topology.longest_wait() or 3600.0
    return RetryPolicy("backoff", topology.names.max_attempts, cap, cap)


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    purge = commands.add_parser("purge", help="delete records older than --older-than-days")
    purge.add_argument("--older-than-days", type=float, default=DEFAULT_RETENTION / DAY)
    purge.add_argument(
        "--replay-window-days",
        type=float,
        default=DEFAULT_REPLAY_WINDOW / DAY,
        help="how long after a failure a message may still be replayed or re-sent",
    )
    stats = commands.add_parser("stats", help="records held and the oldest one")
    for sub in (purge, stats):
        add_topology_option(sub)
        sub.add_argument(
            "--dedup-url",
            default=None,
            help="a SQLite path, sqlite:///PATH or postgresql://... (default: the worker's file)",
        )
    args = parser.parse_args()
    if args.command == "purge":
        older_than = args.older_than_days * DAY
        policy = longest_policy(topology_from(args))
        check_retention(older_than, policy, args.replay_window_days * DAY)
    url = args.dedup_url or default_dedup_path(settings_from_env("amqp-lab dedup"), ROOT / ".state")
    store = open_store(url)
    try:
        if args.command == "purge":
            boundary = cutoff(time.time(), older_than)
            purged = store.purge(boundary)
            print(
                f"purged processed={purged.processed} first_seen={purged.first_seen} "
                f"older_than={utc_iso(boundary)} store={store.location}"
            )
        else:
            held = store.stats()
            oldest = "-" if held.oldest is None else utc_iso(held.oldest)
            print(f"processed={held.processed} oldest={oldest} store={store.location}")
    finally:
        store.close()
    return EXIT_OK


if __name__ == "__main__":
    run(main)
