"""Consume a topology's work queue with your handler: manual ack after the work, prefetch,
dedup, DLQ records.

One line per delivery:
``message_id=<id> outcome=processed|duplicate|requeued|dead-lettered|parked attempts=<n> ...``
and a final ``worker stopped: ...`` line; with ``--log-format json`` one JSON object per line
instead (events ``metrics``, ``delivery``, ``worker_stopped``; on stderr ``log``, ``signal``,
``error``). ``--metrics-port`` serves
Prometheus metrics on /metrics. Exit 0 when it finished (idle-exit, max-messages,
SIGTERM drained), 130 after SIGINT drained, 1 with one ``error:`` line otherwise; a second
signal exits at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from amqp_lab.cli.common import (
    EXIT_OK,
    add_topology_option,
    load_callable,
    run,
    settings_from_env,
    topology_from,
)
from amqp_lab.cli.relay import add_outbox_options, start_worker_relay
from amqp_lab.cli.state import default_dedup_path
from amqp_lab.consuming.consumer import Consumer, ConsumerConfig, DeliveryReport
from amqp_lab.consuming.handler_contract import check_handler
from amqp_lab.consuming.lifecycle import SignalDrain
from amqp_lab.dedup import open_store
from amqp_lab.dedup.retention import (
    DAY,
    DEFAULT_PURGE_INTERVAL,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_RETENTION,
    PeriodicPurge,
    check_retention,
)
from amqp_lab.errors import ConfigurationError
from amqp_lab.observability.logs import LOG_FORMATS, json_line, report_event, use_json_logs
from amqp_lab.observability.metrics import ConsumerMetrics, serve_metrics
from amqp_lab.ordering import OrderedConfig, OrderedConsumer
from amqp_lab.retry.policy import RetryPolicy

__all__ = ["default_dedup_path", "entry", "main", "say"]


def ordered_refusals(args: argparse.Namespace) -> list[str]:
    """The plain consumer's options ``--ordered`` cannot honour, as given (empty: none)."""
    refused = []
    if args.concurrency != 1:
        refused.append("--concurrency")
    if args.ack_batch != 1:
        refused.append("--ack-batch")
    if args.dead_letter != "publish":
        refused.append("--dead-letter reject")
    if args.retry != "requeue":
        refused.append(
            "--retry backoff (its retries are in the worker: --max-attempts, --base, --cap)"
        )
    if args.wait_for_queue:
        refused.append("--wait-for-queue")
    if args.handler_warn_after is not None:
        refused.append("--handler-warn-after")
    return refused


def main(
    argv: list[str] | None = None,
    *,
    default_handler: str | None = None,
    state_dir: Path = Path(".state"),
) -> int:
    """The worker command (exit code returned). ``default_handler``: the ``module:function``
    used without ``--handler``; ``state_dir``: where the default SQLite store lives."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_topology_option(parser)
    parser.add_argument(
        "--handler",
        default=default_handler,
        required=default_handler is None,
        metavar="MODULE:FUNCTION",
        help="the handler, called as handler(task, db)"
        + (f" (default: {default_handler})" if default_handler else ""),
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="handlers running at once in this process (each on its own store connection)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="basic.qos prefetch_count (default 10; with --concurrency N > 1: at least "
        "2 * N * --ack-batch, so every handler has its next delivery waiting)",
    )
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="S",
        help="exit 0 after S seconds with nothing to do",
    )
    parser.add_argument("--max-messages", type=int, default=None, metavar="N")
    parser.add_argument(
        "--dead-letter",
        choices=["publish", "reject"],
        default="publish",
        help="publish a confirmed DLQ record (default) or basic.reject to the DLX",
    )
    parser.add_argument(
        "--retry",
        choices=["requeue", "backoff"],
        default="requeue",
        help="requeue: one immediate redelivery; backoff: broker-held waits",
    )
    parser.add_argument(
        "--max-attempts",
        type=int,
        default=5,
        help="backoff: deliveries before the DLQ (1-10); --ordered: tries in the worker (1-100)",
    )
    parser.add_argument(
        "--base", type=float, default=1.0, help="backoff and --ordered: base wait, seconds"
    )
    parser.add_argument(
        "--after-dead-letter",
        choices=["continue", "park"],
        default="continue",
        help="--ordered: after a key's message is dead-lettered, run the key's next message "
        "(continue) or send the key's later messages to the DLQ until a replay (park)",
    )
    parser.add_argument(
        "--cap",
        type=float,
        default=30.0,
        help="backoff: longest wait, seconds (<= 300, the wait queues' TTL)",
    )
    parser.add_argument("--dedup-path", default=None, help="SQLite file of processed message_ids")
    parser.add_argument(
        "--dedup-url",
        default=None,
        help="dedup store: a SQLite path, sqlite:///PATH or postgresql://user@host:5432/db",
    )
    parser.add_argument(
        "--retention-days",
        type=float,
        default=DEFAULT_RETENTION / DAY,
        help="purge dedup records older than this; must exceed retry horizon + replay window",
    )
    parser.add_argument(
        "--replay-window-days",
        type=float,
        default=DEFAULT_REPLAY_WINDOW / DAY,
        help="how long after a failure a message may still be replayed or re-sent",
    )
    parser.add_argument(
        "--purge-interval",
        type=float,
        default=DEFAULT_PURGE_INTERVAL,
        metavar="S",
        help="seconds between purges of expired dedup records (one at start)",
    )
    parser.add_argument("--heartbeat", type=int, default=30, help="seconds")
    parser.add_argument(
        "--ack-batch",
        type=int,
        default=1,
        metavar="N",
        help="handle N deliveries per store transaction and ack them with one "
        "basic.ack(multiple) after its commit (N <= --prefetch; a prefetch of 3*N keeps "
        "deliveries flowing while a batch commits)",
    )
    parser.add_argument(
        "--wait-for-queue",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for a missing queue at start (default: fail at once)",
    )
    parser.add_argument(
        "--resubscribe-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a deleted queue may take to come back before the worker gives up",
    )
    parser.add_argument(
        "--max-redeliveries",
        type=int,
        default=3,
        metavar="N",
        help="broker redeliveries of one message (e.g. its handler kills the worker) before it "
        "goes to the DLQ without running the handler again",
    )
    parser.add_argument(
        "--store-outage",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the dedup store may stay unreachable (deliveries retried) before exit 1",
    )
    parser.add_argument(
        "--handler-warn-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="log a warning (message_id, queue, seconds so far) once for each handler still "
        "running after SECONDS; the handler is not stopped and its delivery stays unacked "
        "(RabbitMQ 4.3 classic queues have no consumer_timeout)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (docs/operating.md)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address --metrics-port binds (default 127.0.0.1; 0.0.0.0 for every one)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text: a line per delivery for people (default); json: one JSON object per line "
        "(message_id, outcome, attempts, queue, vhost, trace_id...), logs included",
    )
    parser.add_argument(
        "--no-verify-topology",
        action="store_true",
        help="do not check (management API, at every connection) that the wait queues and DLX "
        "can bring messages back and that the DLQ keeps every record it confirmed",
    )
    add_outbox_options(parser)
    args = parser.parse_args(argv)
    topology = topology_from(args)
    names = topology.names
    max_attempts = names.max_attempts
    max_cap = topology.longest_wait() or 3600.0
    if args.max_redeliveries < 1 or args.store_outage < 0 or args.wait_for_queue < 0:
        parser.error("--max-redeliveries must be >= 1, --store-outage/--wait-for-queue >= 0")
    if names.shards:
        refused = ordered_refusals(args)
        if refused:
            parser.error(
                "--ordered runs one handler at a time and retries in the worker (docs/ordering.md)"
                f"; it does not take {', '.join(refused)}"
            )
        if not 1 <= args.max_attempts <= 100:
            parser.error("--max-attempts must be 1..100 (tries in the worker)")
    elif args.after_dead_letter != "continue":
        parser.error("--after-dead-letter park is for the ordered topology (--ordered N)")
    if args.prefetch is None:
        args.prefetch = (
            10 if args.concurrency == 1 else max(10, 2 * args.concurrency * args.ack_batch)
        )
    if args.prefetch < 1:
        parser.error("--prefetch must be >= 1")
    if not 1 <= args.ack_batch <= args.prefetch:
        parser.error("--ack-batch must be within 1..--prefetch")
    if args.concurrency < 1:
        parser.error("--concurrency must be >= 1")
    if args.concurrency * args.ack_batch > args.prefetch:
        parser.error(
            f"--prefetch must be at least --concurrency x --ack-batch "
            f"({args.concurrency * args.ack_batch}): handlers beyond it would sit idle"
        )
    if args.retry == "backoff" and not names.shards and not 1 <= args.max_attempts <= max_attempts:
        parser.error(
            f"--max-attempts must be 1..{max_attempts} (the topology has "
            f"{names.wait_queues} wait queues, one per retry)"
        )
    if args.base < 0 or not 0 <= args.cap <= max_cap:
        parser.error(
            f"--base must be >= 0 and --cap within 0..{max_cap:g} seconds (the wait queues' "
            "message-ttl)"
        )
    if args.retry == "backoff":
        retry = RetryPolicy("backoff", args.max_attempts, args.base, args.cap)
    else:
        retry = RetryPolicy()
    if args.handler_warn_after is not None and not args.handler_warn_after > 0:
        parser.error("--handler-warn-after must be > 0 seconds")
    if args.purge_interval <= 0:
        parser.error("--purge-interval must be > 0 seconds")
    if args.dedup_url and args.dedup_path:
        parser.error("give --dedup-url or --dedup-path, not both")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        parser.error("--metrics-port must be within 0..65535")
    retention = args.retention_days * DAY
    check_retention(retention, retry, args.replay_window_days * DAY)  # refuses to start
    queue_name = ",".join(names.shard_queues) if names.shards else names.queue
    if args.log_format == "json":
        use_json_logs(queue=queue_name)  # from here on, an error line is JSON too
    settings = settings_from_env("amqp-lab worker", heartbeat=args.heartbeat)
    if args.log_format == "json":
        use_json_logs(queue=queue_name, vhost=settings.vhost)
    registry = CollectorRegistry()  # this worker's own: main() may run twice in one process
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    metrics = ConsumerMetrics(settings.vhost, queue_name, registry)
    if args.metrics_port is not None:
        try:
            server, _ = serve_metrics(args.metrics_port, args.metrics_host, registry)
        except OSError as e:
            raise ConfigurationError(
                f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {e}"
            ) from e
        say(
            args.log_format,
            "metrics",
            f"metrics on http://{args.metrics_host}:{server.server_port}/metrics",
            url=f"http://{args.metrics_host}:{server.server_port}/metrics",
        )
    handler = check_handler(load_callable(args.handler), args.handler)
    store_url = args.dedup_url or args.dedup_path or default_dedup_path(settings, state_dir)
    store = open_store(store_url)
    purger = PeriodicPurge(store, retention, args.purge_interval).start()
    config = ConsumerConfig(
        names,
        prefetch=args.prefetch,
        dead_letter=args.dead_letter,
        idle_exit=args.idle_exit,
        max_messages=args.max_messages,
        retry=retry,
        ack_batch=args.ack_batch,
        queue_wait=args.wait_for_queue,
        resubscribe_wait=args.resubscribe_wait,
        max_redeliveries=args.max_redeliveries,
        store_outage=args.store_outage,
        verify_topology=not args.no_verify_topology,
        concurrency=args.concurrency,
        handler_warn_after=args.handler_warn_after,
    )

    def report(r: DeliveryReport) -> None:
        if args.log_format == "json":
            fields = report_event(r, queue=queue_name, vhost=settings.vhost)
            print(json_line("delivery", **fields), flush=True)
        else:
            print(r.line(), flush=True)

    consumer: Consumer | OrderedConsumer
    if names.shards:  # per-key order: in-worker retries (docs/ordering.md)
        ordered = OrderedConfig(
            names,
            prefetch=max(args.prefetch, 50),
            retry=RetryPolicy("backoff", max(1, args.max_attempts), args.base, args.cap),
            after_dead_letter=args.after_dead_letter,
            idle_exit=args.idle_exit,
            max_messages=args.max_messages,
            max_redeliveries=args.max_redeliveries,
            store_outage=args.store_outage,
            verify_topology=not args.no_verify_topology,
        )
        consumer = OrderedConsumer(
            settings, handler, store, ordered, on_report=report, observer=metrics
        )
    else:
        consumer = Consumer(settings, handler, store, config, on_report=report, observer=metrics)

    def on_signal(text: str) -> None:
        if args.log_format == "json":
            text = json_line("signal", level="warning", message=text)
        print(text, file=sys.stderr, flush=True)

    drain = SignalDrain(consumer, on_signal=on_signal)
    relay = start_worker_relay(args, settings, store_url, registry, consumer.stop)
    try:
        with drain:
            handled = consumer.run()
    finally:
        purger.stop()
        relay.stop()  # drains; raises what stopped it
        store.close()
    why = consumer.stop_reason or "finished"
    say(
        args.log_format,
        "worker_stopped",
        f"worker stopped ({why}): {handled} deliveries handled",
        reason=why,
        handled=handled,
        queue=queue_name,
        vhost=settings.vhost,
    )
    return drain.exit_code or EXIT_OK


def say(log_format: str, event: str, text: str, **fields: Any) -> None:
    """One line on stdout: ``text`` for people, or the JSON ``event`` with ``fields``."""
    print(json_line(event, **fields) if log_format == "json" else text, flush=True)


def entry() -> None:
    """The ``amqp-lab-worker`` console script (``--handler`` required)."""
    run(main)
