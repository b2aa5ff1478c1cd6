#!/usr/bin/env python3
"""Check what publisher confirms and mandatory cannot see: the work queue exists and has
consumers (and, with --dlq-depth, the DLQ is not deeper than N; with --outbox-url, the outbox's
rows are not waiting, refused or without a relay).

Exit 0 and an ``ok:`` line when healthy; 2 with one ``ALERT:`` line per problem (for cron:
``python scripts/health.py || notify ...``); 1 when the broker cannot be asked.
"""

from __future__ import annotations

from _cli import EXIT_ALERT, EXIT_OK, add_topology_option, run, settings_from_env, topology_from

from amqp_lab.cli.parser import CommandParser
from amqp_lab.health import health_problems, outbox_health, outbox_problems, queue_health


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    add_topology_option(parser)
    parser.add_argument("--queue", default=None, help="the work queue (default: the topology's)")
    parser.add_argument("--min-consumers", type=int, default=1, metavar="N")
    parser.add_argument("--dlq", default=None, help="the DLQ (default: the topology's)")
    parser.add_argument(
        "--dlq-depth", type=int, default=None, metavar="N", help="alert when the DLQ holds more"
    )
    outbox = parser.add_argument_group("the outbox (docs/outbox.md)")
    outbox.add_argument("--outbox-url", default=None, help="a SQLite path or postgresql://...")
    outbox.add_argument(
        "--outbox-age", type=float, default=60.0, metavar="S", help="alert when a row waits longer"
    )
    outbox.add_argument(
        "--outbox-failed", type=int, default=0, metavar="N", help="alert beyond N refused rows"
    )
    outbox.add_argument(
        "--outbox-relays", type=int, default=1, metavar="N", help="alert below N relays running"
    )
    args = parser.parse_args()
    if args.min_consumers < 0 or (args.dlq_depth is not None and args.dlq_depth < 0):
        parser.error("--min-consumers and --dlq-depth must be >= 0")
    names = topology_from(args).names
    args.queue = args.queue or names.queue
    args.dlq = args.dlq or names.dlq
    settings = settings_from_env("amqp-lab health")
    work = queue_health(settings, args.queue)
    dlq = queue_health(settings, args.dlq) if args.dlq_depth is not None else None
    problems = health_problems(work, settings.vhost, args.min_consumers, dlq, args.dlq_depth)
    if args.outbox_url:
        status, where = outbox_health(args.outbox_url)
        problems += outbox_problems(
            status, where, args.outbox_age, args.outbox_failed, min_relays=args.outbox_relays
        )
    for problem in problems:
        print(f"ALERT: {problem}")
    if problems:
        return EXIT_ALERT
    print(
        f"ok: {args.queue!r} in vhost {settings.vhost!r} has {work.consumers} consumer(s) and "
        f"{work.messages} message(s) ready"
        + (f"; outbox {status.line()}" if args.outbox_url else "")
    )
    return EXIT_OK


if __name__ == "__main__":
    run(main)
