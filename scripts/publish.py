#!/usr/bin/env python3
"""Publish lab tasks, or your own JSON bodies (--body), with publisher confirms, mandatory and
persistence, to the topology's exchange and routing key (--topology FILE).

One line per message: ``message_id=<id> status=confirmed|unroutable|nacked|failed``.
A long run (--count N --rate R) can serve Prometheus metrics with --metrics-port.
Exit 0 only if every message was confirmed; 3 if any was unroutable; 1 otherwise.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid

from _cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNROUTABLE,
    add_topology_option,
    run,
    settings_from_env,
    topology_from,
)

from amqp_lab.cli.parser import CommandParser
from amqp_lab.errors import AmqpLabError, ConfigurationError, MessageNacked, MessageUnroutable
from amqp_lab.exporters.metrics import PublisherMetrics
from amqp_lab.exporters.server import serve_metrics
from amqp_lab.message import ATTEMPTS_HEADER, KEY_HEADER, decode_json, encode_json, message_for
from amqp_lab.oneline import one_line
from amqp_lab.publishing.blocking import Publisher, PublishRetry
from lab.handler import KINDS, task_message


def key_for(key: str | None, keys: int, seq: int) -> str | None:
    """Message ``seq``'s key: ``key``, or ``KEY-n`` round-robin over ``keys`` keys."""
    if keys:
        return f"{key or 'key'}-{(seq - 1) % keys + 1}"
    return key


def undecodable_byte(value: str | None) -> int | None:
    """The first byte of a command-line argument that was not UTF-8 (Python keeps it as a
    lone surrogate, U+DC80..U+DCFF: PEP 383), or None."""
    for char in value or "":
        if "\udc80" <= char <= "\udcff":
            return ord(char) - 0xDC00
    return None


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    add_topology_option(parser)
    parser.add_argument("--kind", choices=KINDS, default="ok", help="a lab task of this kind")
    parser.add_argument(
        "--body", default=None, metavar="JSON", help="publish this JSON value instead of a lab task"
    )
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--message-id", help="default: a new uuid4 per message")
    parser.add_argument("--routing-key", default=None, help="default: the topology's")
    parser.add_argument("--exchange", default=None, help="default: the topology's")
    parser.add_argument(
        "--key",
        default=None,
        help="the entity key of per-key ordering: the 'key' header and the routing key "
        "(required with --ordered; docs/ordering.md)",
    )
    parser.add_argument(
        "--keys",
        type=int,
        default=0,
        metavar="K",
        help="spread the messages round-robin over K keys KEY-1..KEY-K (KEY: --key or 'key')",
    )
    parser.add_argument(
        "--transient", action="store_true", help="delivery_mode 1 (only for the durability demo)"
    )
    parser.add_argument("--retries", type=int, default=5, help="publish attempts per message")
    parser.add_argument(
        "--blocked-timeout",
        type=float,
        default=30.0,
        help="seconds a memory alarm may block us before we fail",
    )
    parser.add_argument(
        "--rate", type=float, default=None, metavar="R", help="at most R messages per second"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics while publishing "
        "(published by outcome, confirm latency, blocked seconds, reconnects)",
    )
    args = parser.parse_args()
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be > 0")
    if args.count < 1:
        parser.error("--count must be >= 1")
    if args.keys < 0:
        parser.error("--keys must be >= 1")
    for option in ("body", "message_id", "key", "routing_key", "exchange"):
        not_utf8 = undecodable_byte(getattr(args, option))
        if not_utf8 is not None:
            parser.error(f"--{option.replace('_', '-')} is not UTF-8: byte 0x{not_utf8:02x}")
    body = None
    if args.body is not None:
        try:
            body = decode_json(args.body)
        except (ValueError, RecursionError) as e:
            parser.error(f"--body is not JSON: {one_line(str(e))}")
        try:
            encode_json(body)
        except ValueError as e:
            parser.error(f"--body cannot be sent as JSON: {e}")
    names = topology_from(args).names
    if names.shards and args.key is None and not args.keys and args.routing_key is None:
        parser.error("the ordered topology routes by key: give --key KEY or --keys K")
    unkeyed = dataclasses.replace(names, shards=0, shard_queue_template=None)
    exchange = names.exchange if args.exchange is None else args.exchange
    routing_key = names.routing_key if args.routing_key is None else args.routing_key
    settings = settings_from_env(
        "amqp-lab publish", blocked_connection_timeout=args.blocked_timeout
    )
    metrics = PublisherMetrics(settings.vhost)
    if args.metrics_port is not None:
        try:
            server, _ = serve_metrics(args.metrics_port)
        except OSError as e:
            why = f"cannot serve metrics on port {args.metrics_port}: {e}"
            raise ConfigurationError(why) from e
        print(f"metrics on http://127.0.0.1:{server.server_port}/metrics", file=sys.stderr)
    unroutable = failed = 0
    started = time.monotonic()
    retry = PublishRetry(max_attempts=args.retries)
    with Publisher(settings, retry, observer=metrics) as publisher:
        for seq in range(1, args.count + 1):
            if args.rate is not None:
                time.sleep(max(0.0, started + (seq - 1) / args.rate - time.monotonic()))
            message_id = args.message_id or str(uuid.uuid4())
            key = key_for(args.key, args.keys, seq)
            if body is None:
                message = task_message(
                    args.kind,
                    seq,
                    message_id,
                    exchange=exchange,
                    routing_key=routing_key,
                    persistent=not args.transient,
                )
                if key is not None:
                    message = dataclasses.replace(
                        message, routing_key=key, headers={**message.headers, KEY_HEADER: key}
                    )
            else:
                # with a key, message_for routes by it (key header + routing key); without
                # one on the ordered topology, --routing-key routes by hand (checked above)
                message = message_for(
                    names if key is not None else unkeyed,
                    body,
                    message_id=message_id,
                    headers={ATTEMPTS_HEADER: 0},
                    key=key,
                    persistent=not args.transient,
                )
                message = dataclasses.replace(
                    message, exchange=exchange, routing_key=routing_key if key is None else key
                )
            status, detail, stop = "confirmed", "", False
            try:
                publisher.publish(message)
            except MessageUnroutable as e:
                status, detail = "unroutable", str(e)
                unroutable += 1
            except MessageNacked as e:
                status, detail = "nacked", str(e)
                failed += 1
            except AmqpLabError as e:
                # PublishFailed after retries, BrokerBlocked, a missing exchange, bad credentials:
                # the next message would meet the same fate, so stop here.
                status, detail, stop = "failed", str(e), True
                failed += 1
            line = f"message_id={one_line(message.message_id)} status={status}"
            print(line + (f" error={detail!r}" if detail else ""), flush=True)
            if stop:
                if seq < args.count:
                    print(f"stopped: {args.count - seq} message(s) not sent")
                break
    if unroutable:
        return EXIT_UNROUTABLE
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    run(main)
