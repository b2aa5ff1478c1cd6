#!/usr/bin/env python3
"""List the DLQ (q:tasks:dlq) without consuming it: a table, or --json (one object per line).

--alert-depth N exits 2 with a one-line alert when the DLQ holds more than N messages.
"""

from __future__ import annotations

import argparse
import json

from _cli import EXIT_ALERT, EXIT_OK, run, settings_from_env

from amqp_lab.dlq import DLQ, browse, depth


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", default=DLQ)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--alert-depth", type=int, default=None, metavar="N")
    parser.add_argument("--limit", type=int, default=None, help="list at most N records")
    args = parser.parse_args()
    settings = settings_from_env("amqp-lab dlq")
    if args.alert_depth is not None:
        count = depth(settings, args.queue)
        if count > args.alert_depth:
            print(
                f"ALERT: DLQ {args.queue} in vhost {settings.vhost!r} holds {count} messages "
                f"(threshold {args.alert_depth})"
            )
            return EXIT_ALERT
        print(f"ok: DLQ {args.queue} holds {count} messages (threshold {args.alert_depth})")
        return EXIT_OK
    entries = browse(settings, args.queue, args.limit)
    if args.json:
        for entry in entries:
            print(json.dumps(entry.as_dict(), sort_keys=True, default=str))
        return EXIT_OK
    print(f"{'message_id':38} {'attempts':>8} {'class':10} {'error':44} first_seen_at")
    for e in entries:
        error = f"{e.error_type}: {e.error_message}"
        attempts = "-" if e.attempts is None else str(e.attempts)
        print(
            f"{(e.message_id or '-')[:38]:38} {attempts:>8} {e.classification[:10]:10} "
            f"{error[:44]:44} {e.first_seen_at or '-'}"
        )
    print(f"{len(entries)} message(s) in {args.queue}")
    return EXIT_OK


if __name__ == "__main__":
    run(main)
