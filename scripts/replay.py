#!/usr/bin/env python3
"""Replay DLQ messages to the tasks exchange - only when asked: --all or --message-id ID.

Each is republished with confirms + mandatory (original payload, same message_id, attempts 0,
x-death removed); its DLQ copy is removed only after the confirm. --dry-run lists what would go.
Exit 0 when every selected message was replayed, 1 when any failed or none matched an ID.
"""

from __future__ import annotations

import argparse

from _cli import EXIT_FAILED, EXIT_OK, run, settings_from_env

from amqp_lab.dlq import DLQ, ReplayResult, replay


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--all", action="store_true")
    group.add_argument("--message-id")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--queue", default=DLQ)
    args = parser.parse_args()
    settings = settings_from_env("amqp-lab replay")

    def show(result: ReplayResult) -> None:
        line = f"message_id={result.entry.message_id} status={result.status}"
        print(line + (f" error={result.detail!r}" if result.detail else ""), flush=True)

    results = replay(
        settings,
        lambda entry: args.all or entry.message_id == args.message_id,
        queue=args.queue,
        dry_run=args.dry_run,
        on_result=show,
    )
    failed = sum(r.status == "failed" for r in results)
    print(
        f"{len(results)} selected, {len(results) - failed} "
        f"{'would be replayed' if args.dry_run else 'replayed'}, {failed} failed"
    )
    if args.message_id and not results:
        print(f"no DLQ message with message_id={args.message_id}")
        return EXIT_FAILED
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    run(main)
