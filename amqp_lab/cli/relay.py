"""Relay an outbox: publish its committed rows with confirms and mandatory (docs/outbox.md).

The command line of ``amqp-lab-relay`` (``scripts/relay.py``) and the worker's
``--outbox`` thread.

    amqp-lab-relay [run] --outbox-url URL [--batch 500] [--lease 30] [--keep-sent-days 0] ...
    amqp-lab-relay status --outbox-url URL [--json]
    amqp-lab-relay retry --outbox-url URL (--message-id ID | --all)
    amqp-lab-relay discard --outbox-url URL --message-id ID
    amqp-lab-relay schema --dialect postgresql|sqlite

``run`` relays until SIGTERM / SIGINT (which drain: the confirms in flight are awaited and
recorded, the leases released; a second signal exits at once) or ``--idle-exit``; one line per
row settled (``message_id=<id> outcome=sent|refused|lost tries=<n> ...``) unless ``--quiet``,
and a last line ``relay stopped (<why>): ...``. ``status`` prints the depth, the oldest
pending age, the relays and every refused row; ``retry`` makes refused rows due now (parked
ones too); ``discard`` deletes a refused row (its key's later rows go on); ``schema`` prints
the tables' SQL for your migrations. Exit 0, 130 after SIGINT, 1 with one ``error:`` line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from amqp_lab.cli.common import EXIT_OK, add_gc_option, run, settings_from_env
from amqp_lab.cli.parser import CommandParser
from amqp_lab.consuming.lifecycle import SignalDrain
from amqp_lab.dedup.retention import DAY
from amqp_lab.errors import ConfigurationError
from amqp_lab.exporters.metrics import PublisherMetrics
from amqp_lab.exporters.outbox_metrics import OutboxMetrics
from amqp_lab.exporters.server import serve_metrics
from amqp_lab.gc_policy import tuned_gc
from amqp_lab.observability.logs import LOG_FORMATS, json_line, use_json_logs
from amqp_lab.outbox.observer import RelayConfig, RelayReport
from amqp_lab.outbox.relay import OutboxRelay
from amqp_lab.outbox.schema import schema
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings, mask_url

__all__ = ["WorkerRelay", "add_outbox_options", "entry", "main", "start_worker_relay"]

log = logging.getLogger("amqp_lab.outbox.relay")

COMMANDS = ("run", "status", "retry", "discard", "schema")
OPERATOR_LOCK_TIMEOUT = 10.0
"""Seconds ``status`` / ``retry`` / ``discard`` wait for a lock on the outbox (PostgreSQL)."""


def _relay_options(parser: argparse.ArgumentParser | Any, prefix: str = "--") -> None:
    """The relay's tuning options, as ``--batch`` (the command) or ``--outbox-batch`` (the
    worker)."""
    parser.add_argument(f"{prefix}batch", type=int, default=500, metavar="N", help="rows per lease")
    parser.add_argument(
        f"{prefix}lease",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a lease lives unless renewed (a killed relay holds its rows that long)",
    )
    parser.add_argument(
        f"{prefix}keep-sent-days",
        type=float,
        default=0.0,
        metavar="D",
        help="keep sent rows this long (sent_at set) before purging them (0: delete at once)",
    )
    parser.add_argument(
        f"{prefix}poll",
        type=float,
        default=None,
        metavar="S",
        help="longest sleep without a wake-up",
    )
    parser.add_argument(
        f"{prefix}retry-cap",
        type=float,
        default=300.0,
        metavar="S",
        help="longest wait before a refused row is tried again",
    )


def _config(args: argparse.Namespace, prefix: str = "", **extra: Any) -> RelayConfig:
    def get(name: str) -> Any:
        return getattr(args, prefix + name)

    try:
        return RelayConfig(
            batch_rows=get("batch"),
            lease=get("lease"),
            keep_sent=get("keep_sent_days") * DAY,
            poll=get("poll"),
            retry_cap=max(get("retry_cap"), 1.0),
            **extra,
        )
    except ValueError as e:
        raise ConfigurationError(f"relay options: {e}") from e


def main(argv: list[str] | None = None, *, default_outbox: Callable[[], str] | None = None) -> int:
    """The relay command (exit code returned). ``default_outbox``: the outbox used without
    ``--outbox-url`` (scripts/relay.py: the worker's default store)."""
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="run", choices=COMMANDS)
    parser.add_argument(
        "--outbox-url",
        default=None,
        help="the outbox's database: a SQLite path, sqlite:///PATH or postgresql://..."
        + (" (default: the worker's dedup store)" if default_outbox else ""),
    )
    _relay_options(parser)
    parser.add_argument("--no-listen", action="store_true", help="PostgreSQL: poll only")
    add_gc_option(parser)
    parser.add_argument("--idle-exit", type=float, default=None, metavar="S")
    parser.add_argument("--quiet", action="store_true", help="no line per row")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    parser.add_argument("--json", action="store_true", help="status: one JSON object")
    parser.add_argument("--limit", type=int, default=100, help="status: refused rows listed")
    parser.add_argument("--message-id", default=None, help="retry / discard: the row")
    parser.add_argument("--all", action="store_true", help="retry: every refused row")
    parser.add_argument("--dialect", choices=("postgresql", "sqlite"), default="postgresql")
    args = parser.parse_args(argv)
    if args.command == "schema":
        for statement in schema(args.dialect):
            print(statement + ";")
        return EXIT_OK
    if args.command == "discard" and not args.message_id:
        parser.error("discard needs --message-id")
    if args.command == "retry" and bool(args.message_id) == args.all:
        parser.error("retry needs --message-id ID or --all")
    if args.outbox_url is None:
        if default_outbox is None:
            parser.error("--outbox-url is required")
        args.outbox_url = default_outbox()
    if args.command == "run":
        return _run(args)
    # an operator's command: a table locked by a migration is a one-line error, not a hang
    store = OutboxStore(args.outbox_url, lock_timeout=OPERATOR_LOCK_TIMEOUT)
    try:
        return _operate(store, args)
    finally:
        store.close()


def _operate(store: OutboxStore, args: argparse.Namespace) -> int:
    if args.command == "retry":
        count = store.retry(None if args.all else args.message_id)
        print(f"{count} refused row(s) due again in {store.location}")
    elif args.command == "discard":
        row = store.discard(args.message_id)
        if row is None:
            raise ConfigurationError(
                f"no refused row with message_id {args.message_id!r} that no relay holds in "
                f"{store.location} (a pending one is cancelled with amqp_lab.outbox.cancel)"
            )
        print(json.dumps({"discarded": row.as_dict()}, allow_nan=False))
    else:
        status, failed = store.status(), store.failed(args.limit)
        if args.json:
            data = status.as_dict() | {"refused": [f.as_dict() for f in failed]}
            print(json.dumps(data, allow_nan=False))
        else:
            print(f"outbox {store.location}: {status.line()}")
            for row in failed:
                print("refused: " + json.dumps(row.as_dict(), allow_nan=False))
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    if args.log_format == "json":
        use_json_logs()
    settings = settings_from_env("amqp-lab relay")
    registry = CollectorRegistry()
    config = _config(args, listen=not args.no_listen, idle_exit=args.idle_exit)
    observer = OutboxMetrics(settings.vhost, _masked(args.outbox_url), registry)
    if args.metrics_port is not None:
        try:
            server, _ = serve_metrics(args.metrics_port, args.metrics_host, registry)
        except OSError as e:
            raise ConfigurationError(
                f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {e}"
            ) from e
        url = f"http://{args.metrics_host}:{server.server_port}/metrics"
        _say(args, "metrics", f"metrics on {url}", url=url)

    def report(r: RelayReport) -> None:
        if not args.quiet:
            _say(args, "relayed", r.line(), **r.__dict__)

    relay = OutboxRelay(
        settings,
        args.outbox_url,
        config,
        observer=observer,
        publisher_observer=PublisherMetrics(settings.vhost, registry),
        on_report=report,
    )
    drain = SignalDrain(relay, on_signal=lambda text: print(text, file=sys.stderr, flush=True))
    with drain, tuned_gc(args.gc_young_threshold):  # start-up done: what is alive now stays
        relay.run()
    why = relay.stop_reason or "finished"
    text = f"relay stopped ({why}): {relay.sent} sent, {relay.refused} refused, {relay.lost} lost"
    _say(args, "relay_stopped", text, reason=why, sent=relay.sent, refused=relay.refused)
    return drain.exit_code or EXIT_OK


def _say(args: argparse.Namespace, event: str, text: str, **fields: Any) -> None:
    print(json_line(event, **fields) if args.log_format == "json" else text, flush=True)


def _masked(url: str) -> str:
    return mask_url(url)


# --- the worker's --outbox -------------------------------------------------------------------
def add_outbox_options(
    parser: argparse.ArgumentParser, _default_handler: str | None = None
) -> None:
    """The worker's ``--outbox`` (and its ``--outbox-*`` tuning) options."""
    group = parser.add_argument_group("outbox (docs/outbox.md)")
    group.add_argument(
        "--outbox",
        action="store_true",
        help="relay the dedup store's outbox (the follow-ups handlers add with "
        "amqp_lab.outbox.add(db, ...)) from a thread of this worker",
    )
    _relay_options(group, "--outbox-")


class WorkerRelay:
    """The worker's relay thread (a no-op without ``--outbox``)."""

    def __init__(self, relay: OutboxRelay | None) -> None:
        self.relay = relay

    def stop(self, timeout: float | None = None) -> None:
        """Stop the relay (it drains) and wait for it (``timeout`` is the relay's own drain
        bound); raise what ended it, if anything."""
        if self.relay is None:
            return
        self.relay.stop("the worker stopped")
        bound = self.relay.config.stop_bound()
        self.relay.join(bound)
        if self.relay.running:  # the database slower still (connect_timeout, busy_timeout)
            log.warning(
                "the outbox relay did not stop within %g s; its leases expire, and rows confirmed"
                " but not recorded go again (same message_id)",
                bound,
            )
        if self.relay.failure is not None:
            raise self.relay.failure


def start_worker_relay(
    args: argparse.Namespace,
    settings: BrokerSettings,
    outbox: str,
    registry: CollectorRegistry,
    stop_worker: Callable[[str], None],
) -> WorkerRelay:
    """With ``--outbox``: create the outbox tables in ``outbox`` (the worker's dedup store)
    now, before any handler writes, and start the relay thread; a relay that fails for good
    stops the worker (``stop_worker``), which then exits 1 naming it."""
    if not getattr(args, "outbox", False):
        return WorkerRelay(None)
    OutboxStore(outbox).close()  # the tables; raises when the database cannot be used
    relay = OutboxRelay(
        replace(settings, connection_name="amqp-lab worker outbox relay"),
        outbox,
        _config(args, "outbox_"),
        observer=OutboxMetrics(settings.vhost, _masked(outbox), registry),
    )
    relay.start_thread(lambda e: stop_worker(f"the outbox relay failed: {e}"))
    return WorkerRelay(relay)


def entry() -> None:
    """The ``amqp-lab-relay`` console script."""
    run(main)
