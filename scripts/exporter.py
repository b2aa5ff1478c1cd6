#!/usr/bin/env python3
"""Serve the queue-side Prometheus metrics (queue depth, consumers, DLQ age, probe success).

Work queue and DLQ depth, consumers, the DLQ's oldest record age and probe success
(amqp_lab.exporters.queues; docs/operating.md).

    python scripts/exporter.py [--port 9419] [--host 127.0.0.1] [--topology FILE]
                               [--ordered SHARDS] [--timeout S]

Every scrape of http://HOST:PORT/metrics opens one short AMQP connection to EAI_AMQP_URL's
vhost; nothing is consumed. One line on stderr says where it serves (``--port 0``: a free
port, named there); it runs until SIGINT or SIGTERM, then exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

from _cli import EXIT_OK, add_topology_option, run, settings_from_env, topology_from
from prometheus_client import CollectorRegistry

from amqp_lab.cli.parser import CommandParser
from amqp_lab.errors import ConfigurationError
from amqp_lab.exporters.queues import DEFAULT_TIMEOUT, QueueCollector
from amqp_lab.exporters.server import serve_metrics

DEFAULT_PORT = 9419


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    add_topology_option(parser)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds a scrape waits for the broker (default {DEFAULT_TIMEOUT:g})",
    )
    args = parser.parse_args()
    if not 0 <= args.port <= 65535 or args.timeout <= 0:
        parser.error("--port must be within 0..65535 and --timeout > 0")
    names = topology_from(args).names
    settings = settings_from_env("amqp-lab exporter")
    registry = CollectorRegistry()
    registry.register(QueueCollector(settings, names, timeout=args.timeout))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        server, thread = serve_metrics(args.port, args.host, registry)
    except OSError as e:
        raise ConfigurationError(f"cannot serve metrics on {args.host}:{args.port}: {e}") from e
    print(
        f"exporter: serving queue metrics of vhost {settings.vhost!r} on "
        f"http://{args.host}:{server.server_port}/metrics",
        file=sys.stderr,
        flush=True,
    )
    while not stop.wait(1.0):
        pass
    server.shutdown()
    server.server_close()
    thread.join(5.0)
    return EXIT_OK


if __name__ == "__main__":
    run(main)
