#!/usr/bin/env python3
"""The DLQ console: a small web application for operating the dead-letter queue (docs/console.md).

It shows the DLQ of EAI_AMQP_URL's vhost grouped by fingerprint (error type, normalised
message, raising frame), each group's records and each record in full, and replays or deletes
a record or a group after a dry run and a confirmation, writing the same audit log as
scripts/replay.py. Serves http://127.0.0.1:8085/ by default; any other address needs an
access token (--token or EAI_CONSOLE_TOKEN), which every request must then carry.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

from _cli import ROOT, add_topology_option, run, settings_from_env, topology_from

from amqp_lab.cli.parser import CommandParser
from amqp_lab.console.access import TokenLogFilter, check_binding
from amqp_lab.dlq.audit_log import DEFAULT_AUDIT_LOG
from amqp_lab.errors import ConfigurationError


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8085)
    parser.add_argument(
        "--token",
        default=None,
        help="access token every request must carry (default: EAI_CONSOLE_TOKEN); required "
        "on any address but loopback",
    )
    add_topology_option(parser)
    parser.add_argument("--queue", default=None, help="the DLQ (default: the topology's)")
    parser.add_argument(
        "--max-records",
        type=positive_int,
        default=10_000,
        metavar="N",
        help="records a page load reads at most; the page says when the DLQ holds more",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=20.0,
        help="the replay form's default messages per second (default 20)",
    )
    parser.add_argument("--audit-log", default=str(ROOT / DEFAULT_AUDIT_LOG))
    args = parser.parse_args()
    token = args.token or os.environ.get("EAI_CONSOLE_TOKEN") or None
    check_binding(args.host, token)
    if args.rate <= 0:
        parser.error("--rate must be > 0")
    try:
        from werkzeug.serving import make_server

        from amqp_lab.console import create_app
    except ImportError as e:
        raise ConfigurationError(
            f"the console needs Flask ({e}): pip install -e '.[console]'"
        ) from e
    topology = topology_from(args)
    settings = settings_from_env("amqp-lab console")
    queue = args.queue or topology.names.dlq
    app = create_app(
        settings,
        topology.names,
        token=token,
        audit_log=Path(args.audit_log),
        queue=queue,
        max_records=args.max_records,
        default_rate=args.rate,
    )
    logging.getLogger("werkzeug").addFilter(TokenLogFilter(token))
    host = f"[{args.host}]" if ":" in args.host else args.host
    # bind first, and say "on http://..." only once it really listens there; werkzeug would
    # print two lines of its own and exit on a taken port
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    try:
        with socket.socket(family) as probe:
            probe.bind((args.host, args.port))
    except OSError as e:
        raise ConfigurationError(f"cannot listen on {host}:{args.port}: {e}") from e
    server = make_server(args.host, args.port, app, threaded=True)
    print(
        f"DLQ console for {queue} in vhost {settings.vhost!r} ({settings.masked_url}) on "
        f"http://{host}:{args.port}/" + (" (access token required)" if token else ""),
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    run(main)
