"""The worker's options, grouped by concept in ``--help`` (argparse argument groups): what it
consumes and runs, how deliveries flow, retries, dead-lettering, failure bounds, the dedup
store, observability.

Each group is one function of :data:`OPTION_GROUPS`; a new capability of the worker adds its
own group function there (and its part of the run to :mod:`amqp_lab.cli.worker`). Values are
parsed here, not judged: the ranges are the config classes' (RetryPolicy, ConsumerConfig,
OrderedConfig), which raise ConfigurationError (:mod:`amqp_lab.cli.worker_config` turns it
into one line naming the option).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from amqp_lab.cli.common import add_gc_option, add_topology_option
from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.relay import add_outbox_options
from amqp_lab.dedup.retention import (
    DAY,
    DEFAULT_PURGE_INTERVAL,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_RETENTION,
)
from amqp_lab.observability.logs import LOG_FORMATS

__all__ = ["OPTION_GROUPS", "worker_parser"]

OptionGroup = Callable[[CommandParser, "str | None"], None]


def worker_parser(description: str, default_handler: str | None = None) -> CommandParser:
    """The worker's parser: every group of :data:`OPTION_GROUPS`, in order. A
    ``default_handler`` (``module:function``) makes ``--handler`` optional."""
    parser = CommandParser(description=description)
    for add_group in OPTION_GROUPS:
        add_group(parser, default_handler)
    return parser


def _what(parser: CommandParser, default_handler: str | None) -> None:
    group = parser.add_argument_group("what it consumes and runs")
    add_topology_option(group)
    group.add_argument(
        "--handler",
        default=default_handler,
        required=default_handler is None,
        metavar="MODULE:FUNCTION",
        help="the handler, called as handler(task, db)"
        + (f" (default: {default_handler})" if default_handler else ""),
    )
    group.add_argument(
        "--no-verify-topology",
        action="store_true",
        help="do not check (management API, at every connection) that the wait queues and DLX "
        "can bring messages back and that the DLQ keeps every record it confirmed",
    )


def _flow(parser: CommandParser, _default_handler: str | None) -> None:
    group = parser.add_argument_group("deliveries: how many, how fast, when to stop")
    group.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="handlers running at once in this process (each on its own store connection)",
    )
    group.add_argument(
        "--prefetch",
        type=int,
        default=None,
        metavar="N",
        help="basic.qos prefetch_count (default 10; with --concurrency N > 1: at least "
        "2 * N * --ack-batch, so every handler has its next delivery waiting; --ordered: at "
        "least 50)",
    )
    group.add_argument(
        "--ack-batch",
        type=int,
        default=1,
        metavar="N",
        help="handle N deliveries per store transaction and ack them with one "
        "basic.ack(multiple) after its commit (N <= --prefetch; a prefetch of 3*N keeps "
        "deliveries flowing while a batch commits)",
    )
    group.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="S",
        help="exit 0 after S seconds with nothing to do",
    )
    group.add_argument("--max-messages", type=int, default=None, metavar="N")
    add_gc_option(group)


def _retries(parser: CommandParser, _default_handler: str | None) -> None:
    group = parser.add_argument_group("retries of a failed delivery")
    group.add_argument(
        "--retry",
        choices=["requeue", "backoff"],
        default="requeue",
        help="requeue: one immediate redelivery; backoff: broker-held waits in the topology's "
        "wait queues",
    )
    group.add_argument(
        "--max-attempts",
        type=int,
        default=None,
        metavar="N",
        help="backoff: deliveries before the DLQ (default and most: the topology's wait queues "
        "+ 1); --ordered: tries in the worker (1-100, default 5)",
    )
    group.add_argument(
        "--base", type=float, default=1.0, help="backoff and --ordered: base wait, seconds"
    )
    group.add_argument(
        "--cap",
        type=float,
        default=30.0,
        help="backoff and --ordered: longest wait, seconds (at most the wait queues' "
        "message-ttl: 300 in the packaged topology)",
    )
    group.add_argument(
        "--after-dead-letter",
        choices=["continue", "park"],
        default="continue",
        help="--ordered: after a key's message is dead-lettered, run the key's next message "
        "(continue) or send the key's later messages to the DLQ until a replay (park)",
    )


def _dead_letter(parser: CommandParser, _default_handler: str | None) -> None:
    group = parser.add_argument_group("dead-lettering")
    group.add_argument(
        "--dead-letter",
        choices=["publish", "reject"],
        default="publish",
        help="publish a confirmed DLQ record (default) or basic.reject to the DLX",
    )
    group.add_argument(
        "--max-redeliveries",
        type=int,
        default=3,
        metavar="N",
        help="broker redeliveries of one message (e.g. its handler kills the worker) before it "
        "goes to the DLQ without running the handler again",
    )


def _bounds(parser: CommandParser, _default_handler: str | None) -> None:
    group = parser.add_argument_group("failure bounds: how long it waits before it gives up")
    group.add_argument("--heartbeat", type=int, default=30, help="seconds")
    group.add_argument(
        "--wait-for-queue",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for a missing queue at start (default: fail at once)",
    )
    group.add_argument(
        "--resubscribe-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a deleted queue may take to come back before the worker gives up",
    )
    group.add_argument(
        "--store-outage",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the dedup store may stay unreachable (deliveries retried) before exit 1",
    )
    group.add_argument(
        "--handler-warn-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="log a warning (message_id, queue, seconds so far) once for each handler still "
        "running after SECONDS; the handler is not stopped and its delivery stays unacked "
        "(RabbitMQ 4.3 classic queues have no consumer_timeout)",
    )


def _dedup(parser: CommandParser, _default_handler: str | None) -> None:
    group = parser.add_argument_group("the dedup store")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--dedup-path", default=None, help="SQLite file of processed message_ids")
    where.add_argument(
        "--dedup-url",
        default=None,
        help="dedup store: a SQLite path, sqlite:///PATH or postgresql://user@host:5432/db",
    )
    group.add_argument(
        "--dedup-prepare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="PostgreSQL: let psycopg prepare statements on the server; --no-dedup-prepare"
        " behind a pooler in transaction mode without prepared-statement support (PgBouncer"
        " < 1.21)",
    )
    group.add_argument(
        "--retention-days",
        type=float,
        default=DEFAULT_RETENTION / DAY,
        help="purge dedup records older than this; must exceed retry horizon + replay window",
    )
    group.add_argument(
        "--replay-window-days",
        type=float,
        default=DEFAULT_REPLAY_WINDOW / DAY,
        help="how long after a failure a message may still be replayed or re-sent",
    )
    group.add_argument(
        "--purge-interval",
        type=_positive_seconds,
        default=DEFAULT_PURGE_INTERVAL,
        metavar="S",
        help="seconds between purges of expired dedup records (one at start)",
    )


def _observability(parser: CommandParser, _default_handler: str | None) -> None:
    group = parser.add_argument_group("metrics and logs (docs/operating.md)")
    group.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (0: any free port)",
    )
    group.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address --metrics-port binds (default 127.0.0.1; 0.0.0.0 for every one)",
    )
    group.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text: a line per delivery for people (default); json: one JSON object per line "
        "(message_id, outcome, attempts, queue, vhost, trace_id...), logs included",
    )


def _positive_seconds(text: str) -> float:
    """Seconds, > 0."""
    try:
        seconds = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from e
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, not {text}")
    return seconds


def _port(text: str) -> int:
    """A TCP port, 0..65535 (0: the system picks one)."""
    try:
        port = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from e
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 0..65535")
    return port


OPTION_GROUPS: list[OptionGroup] = [
    _what,
    _flow,
    _retries,
    _dead_letter,
    _bounds,
    _dedup,
    _observability,
    add_outbox_options,
]
"""The worker's option groups, in ``--help`` order; each adds one argument group."""
