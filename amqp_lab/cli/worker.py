"""Consume a topology's work queue with your handler: manual ack after the work, prefetch,
dedup, DLQ records.

One line per delivery:
``message_id=<id> outcome=processed|duplicate|requeued|retried|dead-lettered|parked
attempts=<n> ...`` (the same outcome names as the metrics: docs/operating.md) and a final
``worker stopped: ...`` line; with ``--log-format json`` one JSON object per line instead
(events ``metrics``, ``delivery``, ``worker_stopped``; on stderr ``log``, ``signal``,
``error``). ``--metrics-port`` serves Prometheus metrics on /metrics. Exit 0 when it finished
(idle-exit, max-messages, SIGTERM drained), 130 after SIGINT drained, 2 with one ``error:``
line for a refused option, 1 with one ``error:`` line otherwise; a second signal exits at
once. The options, grouped by concept: :mod:`amqp_lab.cli.worker_options`; made into config
objects: :mod:`amqp_lab.cli.worker_config`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from amqp_lab.cli.common import EXIT_OK, load_callable, run, settings_from_env, topology_from
from amqp_lab.cli.relay import start_worker_relay
from amqp_lab.cli.state import default_dedup_path
from amqp_lab.cli.worker_config import WorkerConfig, configs_from, ordered_refusals
from amqp_lab.cli.worker_options import worker_parser
from amqp_lab.consuming.consumer import Consumer, ConsumerConfig, DeliveryReport
from amqp_lab.consuming.handler_contract import check_handler
from amqp_lab.consuming.lifecycle import SignalDrain
from amqp_lab.dedup import ManagedDedupStore, open_store
from amqp_lab.dedup.retention import PeriodicPurge
from amqp_lab.errors import ConfigurationError
from amqp_lab.exporters.metrics import ConsumerMetrics, process_registry
from amqp_lab.exporters.server import serve_metrics
from amqp_lab.gc_policy import tuned_gc
from amqp_lab.observability.logs import json_line, report_event, use_json_logs
from amqp_lab.ordering import OrderedConsumer
from amqp_lab.settings import BrokerSettings

__all__ = ["default_dedup_path", "entry", "main", "ordered_refusals", "say"]


class Background(Protocol):
    """Something the worker runs beside its consumer and stops after it (the dedup purge, the
    outbox relay)."""

    def stop(self, timeout: float = ...) -> None: ...


def main(
    argv: list[str] | None = None,
    *,
    default_handler: str | None = None,
    state_dir: Path = Path(".state"),
) -> int:
    """The worker command (exit code returned). ``default_handler``: the ``module:function``
    used without ``--handler``; ``state_dir``: where the default SQLite store lives. A refused
    option exits 2 with one line; other errors are AmqpLabError subclasses for :func:`run`."""
    description = " ".join(__doc__.split("\n\n")[0].split())
    args = worker_parser(description, default_handler).parse_args(argv)
    config = configs_from(args, topology_from(args))
    if args.log_format == "json":
        use_json_logs(queue=config.queue_name)  # from here on, an error line is JSON too
    settings = settings_from_env("amqp-lab worker", heartbeat=args.heartbeat)
    if args.log_format == "json":
        use_json_logs(queue=config.queue_name, vhost=settings.vhost)
    metrics, registry = _metrics(args, settings, config.queue_name)
    handler = check_handler(load_callable(args.handler), args.handler)
    store_url = args.dedup_url or args.dedup_path or default_dedup_path(settings, state_dir)
    store = open_store(store_url, prepare=args.dedup_prepare)
    background: list[Background] = []
    try:
        background.append(PeriodicPurge(store, config.retention, args.purge_interval).start())
        consumer = _consumer(args, settings, config, handler, store, metrics)
        # --outbox: the relay thread (it drains at the stop; a relay that fails for good stops
        # the consumer, and its stop raises what ended it)
        background.append(start_worker_relay(args, settings, store_url, registry, consumer.stop))
        with tuned_gc(args.gc_young_threshold):  # start-up done: what is alive now stays
            handled, exit_code = _run(args, consumer)
    finally:
        for task in reversed(background):
            task.stop()
        store.close()
    why = consumer.stop_reason or "finished"
    say(
        args.log_format,
        "worker_stopped",
        f"worker stopped ({why}): {handled} deliveries handled",
        reason=why,
        handled=handled,
        queue=config.queue_name,
        vhost=settings.vhost,
    )
    return exit_code or EXIT_OK


def _metrics(
    args: argparse.Namespace, settings: BrokerSettings, queue: str
) -> tuple[ConsumerMetrics, CollectorRegistry]:
    """The worker's metrics on a registry of its own (main() may run twice in one process),
    served on ``--metrics-port`` when given (the registry: the outbox relay's metrics join
    it). Raises ConfigurationError for a taken port."""
    registry = process_registry()
    metrics = ConsumerMetrics(settings.vhost, queue, registry)
    if args.metrics_port is not None:
        try:
            server, _ = serve_metrics(args.metrics_port, args.metrics_host, registry)
        except OSError as e:
            raise ConfigurationError(
                f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {e}"
            ) from e
        url = f"http://{args.metrics_host}:{server.server_port}/metrics"
        say(args.log_format, "metrics", f"metrics on {url}", url=url)
    return metrics, registry


def _consumer(
    args: argparse.Namespace,
    settings: BrokerSettings,
    config: WorkerConfig,
    handler: Any,
    store: ManagedDedupStore,
    metrics: ConsumerMetrics,
) -> Consumer | OrderedConsumer:
    """The plain consumer, or the ordered one (per-key order, in-worker retries:
    docs/ordering.md), reporting each delivery as a line."""
    report = _reporter(args.log_format, config.queue_name, settings.vhost)
    if isinstance(config.consumer, ConsumerConfig):
        return Consumer(
            settings, handler, store, config.consumer, on_report=report, observer=metrics
        )
    return OrderedConsumer(
        settings, handler, store, config.consumer, on_report=report, observer=metrics
    )


def _reporter(log_format: str, queue: str, vhost: str) -> Callable[[DeliveryReport], None]:
    """One line per delivery on stdout: the report's text, or its JSON ``delivery`` event."""

    def report(r: DeliveryReport) -> None:
        if log_format == "json":
            print(json_line("delivery", **report_event(r, queue=queue, vhost=vhost)), flush=True)
        else:
            print(r.line(), flush=True)

    return report


def _run(args: argparse.Namespace, consumer: Consumer | OrderedConsumer) -> tuple[int, int | None]:
    """Run the consumer until it returns, draining on SIGTERM/SIGINT: (deliveries handled,
    the signal's exit code or None)."""

    def on_signal(text: str) -> None:
        if args.log_format == "json":
            text = json_line("signal", level="warning", message=text)
        print(text, file=sys.stderr, flush=True)

    drain = SignalDrain(consumer, on_signal=on_signal)
    with drain:
        handled = consumer.run()
    return handled, drain.exit_code


def say(log_format: str, event: str, text: str, **fields: Any) -> None:
    """One line on stdout: ``text`` for people, or the JSON ``event`` with ``fields``."""
    print(json_line(event, **fields) if log_format == "json" else text, flush=True)


def entry() -> None:
    """The ``amqp-lab-worker`` console script (``--handler`` required)."""
    run(main)
