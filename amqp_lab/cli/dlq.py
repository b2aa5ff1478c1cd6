"""List the DLQ (the topology's; default q:tasks:dlq) without consuming it: a table, --json
(one object per line), or --summary (depth, age of the oldest record, counts by error type).

--alert-depth N and --alert-age SECONDS each exit 2 with one alert line when exceeded.
Installed as ``amqp-lab-dlq``; ``scripts/dlq.py`` runs the same command (docs/dlq.md).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from amqp_lab.cli.common import (
    EXIT_ALERT,
    EXIT_OK,
    add_topology_option,
    run,
    settings_from_env,
    topology_from,
)
from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.progress import Progress
from amqp_lab.dlq.ops import browse, depth
from amqp_lab.dlq.summary import summarize
from amqp_lab.dlq.view import DlqEntry
from amqp_lab.oneline import one_line
from amqp_lab.settings import BrokerSettings

__all__ = ["entry", "main"]


def main(argv: list[str] | None = None) -> int:
    """The DLQ listing command (exit code returned): a table, ``--json``, ``--summary``, or
    the ``--alert-depth`` / ``--alert-age`` check (exit 2 when exceeded). Raises AmqpLabError
    subclasses (BrokerConnectionError, TopologyError...) for :func:`run`."""
    args = parser().parse_args(argv)
    if args.queue is None:
        args.queue = topology_from(args).names.dlq
    settings = settings_from_env("amqp-lab dlq")
    where = f"DLQ {args.queue} in vhost {settings.vhost!r}"
    if args.alert_depth is not None or args.alert_age is not None:
        return _alert(args, settings, where)
    with Progress("DLQ records read", total=args.limit) as progress:
        entries = browse(settings, args.queue, args.limit, on_progress=progress.update)
    if args.summary:
        _summary(entries, where)
    elif args.json:
        for entry in entries:
            print(json.dumps(entry.as_dict(), sort_keys=True, default=str, allow_nan=False))
    else:
        _table(entries, args.queue)
    return EXIT_OK


def parser() -> CommandParser:
    """The command's options."""
    parser = CommandParser(description=__doc__.splitlines()[0])
    add_topology_option(parser)
    parser.add_argument("--queue", default=None, help="the DLQ to list (default: the topology's)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--alert-depth", type=int, default=None, metavar="N")
    parser.add_argument(
        "--alert-age",
        type=float,
        default=None,
        metavar="SECONDS",
        help="alert when the oldest record failed longer ago than this",
    )
    parser.add_argument("--limit", type=int, default=None, help="list at most N records")
    return parser


def _alert(args: argparse.Namespace, settings: BrokerSettings, where: str) -> int:
    """One ``ALERT:`` line and exit 2 when a threshold is exceeded, else one ``ok:`` line."""
    alerts: list[str] = []
    count = depth(settings, args.queue)
    if args.alert_depth is not None and count > args.alert_depth:
        alerts.append(f"holds {count} messages (threshold {args.alert_depth})")
    if args.alert_age is not None and count:
        oldest = summarize(browse(settings, args.queue), datetime.now(UTC)).oldest_age
        if oldest is not None and oldest > args.alert_age:
            alerts.append(f"oldest record is {oldest:.0f}s old (threshold {args.alert_age:g}s)")
    if alerts:
        print(f"ALERT: {where} " + "; ".join(alerts))
        return EXIT_ALERT
    print(f"ok: {where} holds {count} messages")
    return EXIT_OK


def _summary(entries: list[DlqEntry], where: str) -> None:
    summary = summarize(entries, datetime.now(UTC))
    age = "-" if summary.oldest_age is None else f"{summary.oldest_age:.0f}s"
    print(f"{where}: depth={summary.depth} oldest_age={age}")
    for error_type, n in summary.by_error_type:
        print(f"  {n:>6}  {one_line(error_type)}")


def _table(entries: list[DlqEntry], queue: str) -> None:
    print(f"{'message_id':38} {'attempts':>8} {'class':10} {'error':44} first_seen_at")
    for e in entries:  # one line each, whatever the message carried (control characters)
        error = one_line(f"{e.error_type}: {e.error_message}")
        attempts = "-" if e.attempts is None else str(e.attempts)
        print(
            f"{one_line(e.message_id or '-')[:38]:38} {attempts:>8} "
            f"{one_line(e.classification)[:10]:10} {error[:44]:44} "
            f"{one_line(e.first_seen_at or '-')}"
        )
    print(f"{len(entries)} message(s) in {queue}")


def entry() -> None:
    """The ``amqp-lab-dlq`` console script."""
    run(main)
