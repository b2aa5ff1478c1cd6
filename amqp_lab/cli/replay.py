"""Replay DLQ messages to the exchange they came from - only when asked, never automatically.

Select with --all, or with any of --message-id, --error-type, --since, --until (ISO 8601, on
the record's last_failed_at); --limit N caps the count, --rate R the messages per second.
Each is republished with confirms + mandatory (original payload, same message_id, attempts 0,
x-death removed); its DLQ copy is removed only after the confirm. Every replayed message gets
an audit line (JSON) in --audit-log (default: .state/replay-audit.jsonl in the current
directory, beside the app). --dry-run lists what would go among the first --window
records (it moves nothing, so it cannot look further).

A replay holds at most --window messages unacked (fewer at a slow --rate), each for at most a
minute, and goes once round the records the DLQ held at its start: records it does not select
are moved to the DLQ's tail (an exact copy, confirmed, then the original acked) when it has to
get past them, so the rest keep their order. Records that arrive meanwhile wait for the next
run. A line on stderr says how many records it examined and moved (docs/dlq.md#replay).
Exit 0 when every selected message was replayed, 1 when any failed or nothing matched an ID.
Installed as ``amqp-lab-replay``; ``scripts/replay.py`` runs the same command.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from amqp_lab.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    add_topology_option,
    run,
    settings_from_env,
    topology_from,
)
from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.progress import Progress
from amqp_lab.cli.state import default_audit_log
from amqp_lab.dlq.audit_log import AuditLog
from amqp_lab.dlq.ops import ReplayResult, replay
from amqp_lab.dlq.summary import Selection
from amqp_lab.dlq.window import DEFAULT_WINDOW, PassReport
from amqp_lab.oneline import one_line
from amqp_lab.settings import BrokerSettings

__all__ = ["entry", "iso_time", "main"]


def iso_time(text: str) -> datetime:
    """An ISO 8601 time (``Z`` allowed; UTC when it names no zone), for ``--since``/``--until``.
    Raises ArgumentTypeError (a one-line usage error) for anything else."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from e
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def main(argv: list[str] | None = None) -> int:
    """The replay command (exit code returned). Raises AmqpLabError subclasses
    (ReplayStopped, BrokerConnectionError...) for :func:`run`, after the pass line."""
    command = parser()
    args = command.parse_args(argv)
    selection = Selection(args.message_id, args.error_type, args.since, args.until, args.key)
    if not args.all and selection == Selection():
        command.error(
            "say what to replay: --all, or --message-id / --error-type / --key / --since / --until"
        )
    if (args.rate is not None and args.rate <= 0) or (args.limit is not None and args.limit < 1):
        command.error("--rate must be > 0 and --limit >= 1")
    if args.window < 1:
        command.error("--window must be >= 1")
    if args.queue is None:
        args.queue = topology_from(args).names.dlq
    settings = settings_from_env("amqp-lab replay")
    passes: list[PassReport] = []
    try:
        results = _replay(args, settings, selection, passes)
    finally:  # also when the pass stopped early: what it did, before the error line
        for done in passes:
            if done.windows or done.depth_after >= 0:  # it got as far as reading the DLQ
                print(done.line(), file=sys.stderr)
    return _summary(args, results, passes)


def parser() -> CommandParser:
    """The command's options."""
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every DLQ message")
    parser.add_argument("--message-id")
    parser.add_argument("--error-type", help="e.g. RuntimeError (see amqp-lab-dlq --summary)")
    parser.add_argument(
        "--key",
        help="the records of this entity key (ordered topology), in DLQ order: replaying a "
        "parked key's records releases it (docs/ordering.md)",
    )
    parser.add_argument("--since", type=iso_time, help="last_failed_at >= this")
    parser.add_argument("--until", type=iso_time, help="last_failed_at <= this")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--rate", type=float, default=None, help="messages per second")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        metavar="N",
        help=f"messages held unacked at most (default {DEFAULT_WINDOW}); a dry run reads this many",
    )
    add_topology_option(parser)
    parser.add_argument("--queue", default=None, help="the DLQ (default: the topology's)")
    parser.add_argument(
        "--audit-log",
        type=Path,
        default=None,
        metavar="PATH",
        help="the JSON-lines audit log, appended to (default: .state/replay-audit.jsonl in the "
        "current directory; the DLQ console writes the same lines)",
    )
    return parser


def _replay(
    args: argparse.Namespace,
    settings: BrokerSettings,
    selection: Selection,
    passes: list[PassReport],
) -> list[ReplayResult]:
    """The replay pass, one line per message on stdout and each one audited."""
    audit_log = args.audit_log or default_audit_log()
    with (
        AuditLog(audit_log, vhost=settings.vhost, queue=args.queue) as log,
        Progress("DLQ records read") as progress,
    ):

        def show(result: ReplayResult) -> None:
            progress.clear()  # the result line starts at column 0; the count is redrawn after
            line = f"message_id={one_line(str(result.entry.message_id))} status={result.status}"
            print(line + (f" error={result.detail!r}" if result.detail else ""), flush=True)
            if result.status != "would-replay":
                log.write(result.entry, result.status, result.detail)

        return replay(
            settings,
            selection.matches,
            queue=args.queue,
            dry_run=args.dry_run,
            limit=args.limit,
            rate=args.rate,
            on_result=show,
            on_progress=progress.update,
            window=args.window,
            in_order=args.key is not None,
            on_pass=passes.append,
        )


def _summary(
    args: argparse.Namespace, results: list[ReplayResult], passes: list[PassReport]
) -> int:
    """The closing lines, and the exit code."""
    failed = sum(r.status == "failed" for r in results)
    (done,) = passes
    if args.dry_run and not done.complete and not args.limit:
        print(
            f"warning: the dry run read {done.examined} of the {done.depth} records "
            "(--window); a replay goes through all of them",
            file=sys.stderr,
        )
    print(
        f"{len(results)} selected, {len(results) - failed} "
        f"{'would be replayed' if args.dry_run else 'replayed'}, {failed} failed"
    )
    if args.message_id and not results:
        print(f"no DLQ message with message_id={one_line(args.message_id)}")
        return EXIT_FAILED
    return EXIT_FAILED if failed else EXIT_OK


def entry() -> None:
    """The ``amqp-lab-replay`` console script."""
    run(main)
