"""The worker's options made into the library's config objects: a RetryPolicy and a
ConsumerConfig, or an OrderedConfig for the ordered topology.

The config classes judge the values (they raise ConfigurationError); :func:`configs_from`
turns such an error into one ``error:`` line that names the option instead of the field
(``ack_batch`` -> ``--ack-batch``), exit 2. What is left here is what only the command line
knows: the defaults derived from the topology (``--max-attempts``: its wait queues + 1) and
from other options (``--prefetch``), and which options a consumer does not take (the
ordered consumer runs one handler at a time and retries in the worker).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from amqp_lab.cli.parser import usage_error
from amqp_lab.consuming.config import ConsumerConfig
from amqp_lab.dedup.retention import DAY, check_retention
from amqp_lab.errors import ConfigurationError
from amqp_lab.ordering import OrderedConfig
from amqp_lab.retry.policy import RetryPolicy
from amqp_lab.topology.model import Names, Topology
from amqp_lab.topology.ordered import is_ordered

__all__ = [
    "OPTION_OF",
    "ORDERED_MAX_ATTEMPTS",
    "WorkerConfig",
    "configs_from",
    "option_text",
    "ordered_refusals",
]

ORDERED_MAX_ATTEMPTS = 5
"""``--ordered``'s default tries in the worker."""

OPTION_OF = {
    "prefetch": "--prefetch",
    "ack_batch": "--ack-batch",
    "concurrency": "--concurrency",
    "idle_exit": "--idle-exit",
    "max_messages": "--max-messages",
    "max_attempts": "--max-attempts",
    "base": "--base",
    "cap": "--cap",
    "after_dead_letter": "--after-dead-letter",
    "dead_letter": "--dead-letter",
    "max_redeliveries": "--max-redeliveries",
    "queue_wait": "--wait-for-queue",
    "resubscribe_wait": "--resubscribe-wait",
    "store_outage": "--store-outage",
    "handler_warn_after": "--handler-warn-after",
}
"""A config field and the worker option that sets it."""
_FIELD = re.compile(r"(?<![\w-])(?<!\w\.)(" + "|".join(OPTION_OF) + r")(?![\w-])")


@dataclass(frozen=True)
class WorkerConfig:
    """What the worker runs: ``consumer`` (a plain or an ordered consumer's config),
    ``retention`` (seconds a dedup record is kept), ``queue_name`` (the queue or the shard
    queues, for logs and metrics)."""

    topology: Topology
    consumer: ConsumerConfig | OrderedConfig
    retention: float
    queue_name: str


def option_text(message: str) -> str:
    """A config class's message in the worker's words: each field it names becomes the
    option that sets it (``ack_batch 50 must be within 1..prefetch`` -> ``--ack-batch 50
    must be within 1..--prefetch``)."""
    return _FIELD.sub(lambda m: OPTION_OF[m.group(1)], message)


def configs_from(args: argparse.Namespace, topology: Topology) -> WorkerConfig:
    """The worker's config objects from its options. A refused value is one ``error:`` line
    naming the option, exit 2 (:func:`amqp_lab.cli.parser.usage_error`)."""
    names = topology.names
    refused = ordered_refusals(args) if is_ordered(topology) else []
    if refused:
        usage_error(
            "--ordered runs one handler at a time and retries in the worker (docs/ordering.md)"
            f"; it does not take {', '.join(refused)}"
        )
    if not is_ordered(topology) and args.after_dead_letter != "continue":
        usage_error("--after-dead-letter park is for the ordered topology (--ordered N)")
    try:
        retry = _retry_policy(args, topology)
        if is_ordered(topology):
            consumer: ConsumerConfig | OrderedConfig = _ordered(args, names, retry)
        else:
            consumer = _plain(args, names, retry)
    except ConfigurationError as e:
        usage_error(option_text(str(e)))
    retention = args.retention_days * DAY
    # a retention the retries and replays outlive: ConfigurationError, exit 1 (docs/dedup.md)
    check_retention(retention, retry, args.replay_window_days * DAY)
    queue = ",".join(names.shard_queues) if names.shards else names.queue
    return WorkerConfig(topology, consumer, retention, queue)


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


def _retry_policy(args: argparse.Namespace, topology: Topology) -> RetryPolicy:
    """``--retry`` as a RetryPolicy. ``--max-attempts`` defaults to what the topology holds:
    its wait queues + 1 in backoff mode, :data:`ORDERED_MAX_ATTEMPTS` tries for
    ``--ordered``. The wait queues' message-ttl bounds ``--cap`` (a longer wait would be
    cut short by the broker)."""
    names = topology.names
    longest = topology.longest_wait()
    bound = longest or 3600.0
    if args.cap > bound:
        ttl = "the wait queues' message-ttl" if longest else "an hour: no policy bounds the waits"
        raise ConfigurationError(
            f"cap must be within 0..{bound:g} seconds ({ttl}), not {args.cap:g}: a longer wait "
            "would be cut short by the broker"
        )
    if is_ordered(topology):
        attempts = ORDERED_MAX_ATTEMPTS if args.max_attempts is None else args.max_attempts
        return RetryPolicy("backoff", attempts, args.base, args.cap)
    if args.retry == "backoff":
        attempts = args.max_attempts if args.max_attempts is not None else names.max_attempts
        return RetryPolicy("backoff", attempts, args.base, args.cap)
    return RetryPolicy()


def _plain(args: argparse.Namespace, names: Names, retry: RetryPolicy) -> ConsumerConfig:
    """The plain consumer's config; ``--prefetch`` defaults to 10, or to 2 x --concurrency x
    --ack-batch with several handlers, so each has its next delivery waiting."""
    if args.prefetch is None:
        busy = 2 * args.concurrency * args.ack_batch
        args.prefetch = 10 if args.concurrency == 1 else max(10, busy)
    return ConsumerConfig(
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


def _ordered(args: argparse.Namespace, names: Names, retry: RetryPolicy) -> OrderedConfig:
    """The ordered consumer's config: a prefetch of at least 50 per shard (held deliveries
    occupy it; a value below 1 is passed on, for OrderedConfig to refuse)."""
    prefetch = args.prefetch
    if prefetch is None or prefetch >= 1:
        prefetch = max(prefetch or 0, 50)
    return OrderedConfig(
        names,
        prefetch=prefetch,
        retry=retry,
        after_dead_letter=args.after_dead_letter,
        idle_exit=args.idle_exit,
        max_messages=args.max_messages,
        max_redeliveries=args.max_redeliveries,
        store_outage=args.store_outage,
        verify_topology=not args.no_verify_topology,
    )
