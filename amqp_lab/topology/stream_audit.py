"""The stream variant of the audit queue (pure): the audit log as a RabbitMQ stream, an
append-only log that keeps entries after they are read, bounded by retention.

:func:`with_stream_audit` turns the topology's audit queue (``Names.audit_queue``) into a
stream (https://www.rabbitmq.com/docs/streams):

* the queue is declared ``x-queue-type: stream`` - a queue's type can only be a declare
  argument - and ``x-stream-max-segment-size-bytes``, which only an argument sets here (the
  brokers under test do not all take it from a policy, and a policy change would only apply to
  new segments anyway);
* retention, ``max-length-bytes`` and ``max-age``, is set **by policy**, which streams accept
  on every version under test (3.10, 4.0, 4.3): it can be changed later without a redeclare;
* keys a stream refuses or ignores are dropped from the audit queue's policy: ``max-length``
  (a count), ``overflow`` (streams never drop-head or reject: retention truncates),
  ``queue-mode``, ``delivery-limit``, ``message-ttl``, dead-lettering.

Retention drops **whole segments**, oldest first, and only when a segment is full and a new one
is started (like Redis ``XADD MAXLEN ~``): the stream holds up to ``max_length_bytes`` plus the
segment being written, so the bound is ``max_length_bytes + max_segment_size_bytes``
(docs/audit-stream.md). ``max-age`` likewise drops a segment once its newest entry is older.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from amqp_lab.errors import TopologyError
from amqp_lab.topology.model import Policy, Queue, Topology

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_LENGTH_BYTES",
    "DEFAULT_MAX_SEGMENT_SIZE_BYTES",
    "STREAM_POLICY_KEYS",
    "is_stream",
    "with_stream_audit",
]

DEFAULT_MAX_LENGTH_BYTES = 1_000_000_000
"""1 GB of audit log (plus one segment) before the oldest segment goes."""
DEFAULT_MAX_AGE = "7D"
DEFAULT_MAX_SEGMENT_SIZE_BYTES = 100_000_000
"""100 MB, a tenth of the default retention: the bound is approximate by one segment."""
STREAM_POLICY_KEYS = (
    "max-length-bytes",
    "max-age",
    "stream-max-segment-size-bytes",
    "queue-leader-locator",
    "initial-cluster-size",
)
"""The policy keys a stream honours; any other key is dropped from the audit queue's policy."""
_MAX_AGE = re.compile(r"^[1-9][0-9]*[YMDhms]$")


def is_stream(queue: Queue) -> bool:
    """Whether the queue is declared ``x-queue-type: stream``."""
    return dict(queue.arguments).get("x-queue-type") == "stream"


def with_stream_audit(
    topology: Topology,
    max_length_bytes: int = DEFAULT_MAX_LENGTH_BYTES,
    max_age: str | None = DEFAULT_MAX_AGE,
    max_segment_size_bytes: int = DEFAULT_MAX_SEGMENT_SIZE_BYTES,
) -> Topology:
    """The topology with its audit queue as a stream (see the module docstring). ``max_age``
    is a RabbitMQ duration, a number and one unit of Y M D h m s (``"7D"``, ``"12h"``), or None
    for size-only retention. Composes with :func:`~amqp_lab.topology.with_queue_type` in either
    order (quorum leaves a stream alone). Raises TopologyError when the topology names no audit
    queue, the queue cannot be a stream (not durable, auto-delete, or another declared type
    than classic/quorum/stream), or a bound is out of range."""
    names = topology.names
    if names.audit_queue is None:
        raise TopologyError('the topology names no "audit_queue": nothing to make a stream')
    if max_length_bytes < 1:
        raise TopologyError(f"max_length_bytes must be >= 1, not {max_length_bytes}")
    if max_segment_size_bytes < 1:
        raise TopologyError(f"max_segment_size_bytes must be >= 1, not {max_segment_size_bytes}")
    if max_age is not None and not _MAX_AGE.match(max_age):
        raise TopologyError(
            f"max_age {max_age!r} is not a RabbitMQ duration: a number and one of Y M D h m s "
            '(e.g. "7D", "12h")'
        )
    audit = topology.queue(names.audit_queue)
    queues = tuple(
        _stream_queue(q, max_segment_size_bytes) if q.name == audit.name else q
        for q in topology.queues
    )
    retention: dict[str, Any] = {"max-length-bytes": max_length_bytes}
    if max_age is not None:
        retention["max-age"] = max_age
    return replace(topology, queues=queues, policies=_stream_policies(topology, audit, retention))


def _stream_queue(queue: Queue, segment_bytes: int) -> Queue:
    arguments = dict(queue.arguments)
    if arguments.get("x-queue-type", "stream") not in ("classic", "quorum", "stream"):
        raise TopologyError(
            f"queue {queue.name!r} is declared x-queue-type {arguments['x-queue-type']!r}"
        )
    if not queue.durable or queue.auto_delete:
        raise TopologyError(
            f"queue {queue.name!r} cannot be a stream: streams are durable and never auto-delete"
        )
    arguments = {k: v for k, v in arguments.items() if not k.startswith("x-max-length")}
    arguments["x-queue-type"] = "stream"
    arguments["x-stream-max-segment-size-bytes"] = segment_bytes
    return replace(queue, arguments=tuple(sorted(arguments.items())))


def _stream_policies(
    topology: Topology, audit: Queue, retention: dict[str, Any]
) -> tuple[Policy, ...]:
    """The policies with the audit queue's one holding stream keys and retention only. A policy
    that matches other queues too is left to them, and a policy of its own, one priority
    higher, is added for the stream."""
    current = topology.policy_for(audit.name)
    shared = current is not None and any(
        topology.policy_for(q.name) == current for q in topology.queues if q.name != audit.name
    )
    kept: dict[str, Any] = {}
    if current is not None:
        kept = {k: v for k, v in current.definition if k in STREAM_POLICY_KEYS}
    kept.update(retention)
    definition = tuple(sorted(kept.items()))
    if current is not None and not shared:
        return tuple(
            replace(p, definition=definition) if p == current else p for p in topology.policies
        )
    own = Policy(
        name=re.sub(r"[^A-Za-z0-9_.-]+", "-", audit.name).strip("-") + "-stream",
        pattern=f"^{re.escape(audit.name)}$",
        definition=definition,
        priority=(current.priority + 1) if current is not None else 10,
    )
    return (*topology.policies, own)
