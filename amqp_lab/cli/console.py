"""The DLQ console: a small web application for operating the dead-letter queue (docs/console.md).

It shows the DLQ of EAI_AMQP_URL's vhost grouped by fingerprint (error type, normalised
message, raising frame), each group's records and each record in full, and replays or deletes
a record or a group after a dry run and a confirmation, writing the same audit log as
amqp-lab-replay (--audit-log PATH; default .state/replay-audit.jsonl in the current
directory). Serves http://127.0.0.1:8085/ by default; any other address needs an access token
(--token or EAI_CONSOLE_TOKEN), which every request must then carry. Installed as
``amqp-lab-console`` (it needs the ``console`` extra, Flask: ``pip install
'amqp-lab[console]'``); ``scripts/console.py`` runs the same command.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import Any

from amqp_lab.cli.common import (
    EXIT_OK,
    add_topology_option,
    require_extra,
    run,
    settings_from_env,
    topology_from,
)
from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.state import default_audit_log
from amqp_lab.errors import ConfigurationError

__all__ = ["entry", "main", "positive_int"]


def positive_int(text: str) -> int:
    """An integer >= 1 (``--max-records``); ArgumentTypeError (a usage error) otherwise."""
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    """The console command: serve until interrupted (exit 0). Raises ConfigurationError for a
    missing ``console`` extra, a non-loopback address without a token or a port it cannot
    listen on, and other AmqpLabError subclasses, for :func:`run`."""
    command = parser()
    args = command.parse_args(argv)
    if args.rate <= 0:
        command.error("--rate must be > 0")
    require_extra("flask", "console", "the DLQ console")
    from amqp_lab.console.access import TokenLogFilter, check_binding

    token = args.token or os.environ.get("EAI_CONSOLE_TOKEN") or None
    check_binding(args.host, token)
    topology = topology_from(args)
    settings = settings_from_env("amqp-lab console")
    queue = args.queue or topology.names.dlq
    from amqp_lab.console import create_app

    app = create_app(
        settings,
        topology.names,
        token=token,
        audit_log=args.audit_log or default_audit_log(),
        queue=queue,
        max_records=args.max_records,
        default_rate=args.rate,
    )
    logging.getLogger("werkzeug").addFilter(TokenLogFilter(token))
    server = _listen(args.host, args.port, app)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"DLQ console for {queue} in vhost {settings.vhost!r} ({settings.masked_url}) on "
        f"http://{host}:{server.server_port}/" + (" (access token required)" if token else ""),
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK


def parser() -> CommandParser:
    """The command's options."""
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
    parser.add_argument(
        "--audit-log",
        type=Path,
        default=None,
        metavar="PATH",
        help="the JSON-lines audit log, shared with amqp-lab-replay (default: "
        ".state/replay-audit.jsonl in the current directory)",
    )
    return parser


def _listen(host: str, port: int, app: Any) -> Any:
    """werkzeug's threaded server for ``app`` on ``host:port``, bound first: werkzeug would
    print two lines of its own and exit on a taken port. Raises ConfigurationError."""
    from werkzeug.serving import make_server

    shown = f"[{host}]" if ":" in host else host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as probe:
            probe.bind((host, port))
    except OSError as e:
        raise ConfigurationError(f"cannot listen on {shown}:{port}: {e}") from e
    return make_server(host, port, app, threaded=True)


def entry() -> None:
    """The ``amqp-lab-console`` console script."""
    run(main)
