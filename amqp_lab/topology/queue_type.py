"""The queue type of a topology (pure): the classic topology as data, and its quorum variant
derived from it, so both keep one set of names.

**Quorum queues** are replicated (Raft) and the only durable replicated queue type since
classic mirroring was removed in RabbitMQ 4.0 (https://www.rabbitmq.com/docs/quorum-queues).
:func:`with_queue_type` turns a topology into its quorum variant:

* every queue is declared with ``x-queue-type: quorum``, which can only be a declare argument
  (a policy cannot change a queue's type);
* a policy that sets a DLX also sets ``dead-letter-strategy: at-least-once`` and
  ``overflow: reject-publish``: dead-lettering out of a classic queue - including a wait
  queue's TTL expiry on its way back to the work queue - is at-most-once, and a crash during
  the move loses the message; at-least-once dead-lettering keeps it in the source queue until
  the target queue confirms it (https://www.rabbitmq.com/docs/quorum-queues#dead-lettering).
  It needs ``reject-publish``: under ``drop-head`` it falls back to at-most-once, so a policy
  with both a DLX and another overflow is refused;
* that policy also sets ``delivery-limit`` as a safety net above the consumer's own retry and
  poison bounds: a message returned that often is dead-lettered by the broker (x-death reason
  ``delivery_limit``);
* a queue without a DLX (the DLQ, the audit queue) gets ``delivery-limit: -1``, no limit: since
  RabbitMQ 4.0 a quorum queue's default limit is 20, and past it a queue without a DLX drops
  the message - listing the DLQ (basic.get then basic.nack requeue) counts as a return up to
  4.2 (https://www.rabbitmq.com/docs/quorum-queues#poison-message-handling);
* ``queue-mode`` (a classic-queue key, gone since 4.3) is left out;
* a stream (the audit queue of :func:`~amqp_lab.topology.stream_audit.with_stream_audit`) is
  already replicated and stays a stream, and a policy that applies to streams only is kept.

Wait queues stay per-message-TTL queues, which quorum queues support since 3.10; the
broker's own delayed retry for quorum queues (4.3) is linear with no jitter, so the wait
queues are kept (docs/topology.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from amqp_lab.errors import TopologyError
from amqp_lab.topology.model import Policy, Queue, Topology

__all__ = [
    "DEFAULT_DELIVERY_LIMIT",
    "QUEUE_TYPES",
    "QueueType",
    "for_broker",
    "queue_type_of",
    "with_queue_type",
]

QueueType = Literal["classic", "quorum"]
QUEUE_TYPES: tuple[QueueType, ...] = ("classic", "quorum")
DEFAULT_DELIVERY_LIMIT = 10
"""The work queues' broker-side delivery limit in the quorum variant: above the consumer's
own bounds (one broker redelivery in requeue mode, ``max_redeliveries`` 3 before poison)."""

_CLASSIC_ONLY_KEYS = ("queue-mode", "queue-version", "queue-master-locator")


def queue_type_of(topology: Topology) -> QueueType:
    """``quorum`` when every queue of the topology is declared ``x-queue-type: quorum``, else
    ``classic``; a stream (the audit queue's stream variant) counts for neither."""
    types = {dict(q.arguments).get("x-queue-type", "classic") for q in topology.queues}
    types.discard("stream")
    return "quorum" if types == {"quorum"} else "classic"


def with_queue_type(
    topology: Topology, queue_type: QueueType, delivery_limit: int = DEFAULT_DELIVERY_LIMIT
) -> Topology:
    """The topology with every queue of type ``queue_type`` (see the module docstring for what
    the quorum variant sets). ``classic`` returns the topology unchanged; converting a quorum
    topology again is a no-op. Raises TopologyError for a queue that cannot be a quorum queue
    (not durable, auto-delete, or another x-queue-type), a policy whose DLX comes with an
    overflow other than reject-publish, or a ``delivery_limit`` below 1."""
    if queue_type == "classic":
        return topology
    if queue_type != "quorum":
        raise TopologyError(f"unknown queue type {queue_type!r}: choose classic or quorum")
    if delivery_limit < 1:
        raise TopologyError(f"delivery_limit must be >= 1, not {delivery_limit}")
    streams = {q.name for q in topology.queues if _is_stream(q)}
    queues = tuple(q if q.name in streams else _quorum_queue(q) for q in topology.queues)
    effective = _effective(topology)
    governed = {p.name: {q for q, e in effective.items() if e == p.name} for p in topology.policies}
    stream_only = {
        name for name, queues_of in governed.items() if queues_of and queues_of <= streams
    }
    policies = tuple(
        p if p.name in stream_only else _quorum_policy(p, delivery_limit) for p in topology.policies
    )
    return replace(topology, queues=queues, policies=policies)


def _effective(topology: Topology) -> dict[str, str | None]:
    """Each queue's effective policy name (None when no policy applies)."""
    return {q.name: getattr(topology.policy_for(q.name), "name", None) for q in topology.queues}


def _is_stream(queue: Queue) -> bool:
    return dict(queue.arguments).get("x-queue-type") == "stream"


def _quorum_queue(queue: Queue) -> Queue:
    arguments = dict(queue.arguments)
    if arguments.get("x-queue-type", "quorum") != "quorum":
        raise TopologyError(
            f"queue {queue.name!r} is declared x-queue-type {arguments['x-queue-type']!r}"
        )
    if not queue.durable or queue.auto_delete:
        raise TopologyError(
            f"queue {queue.name!r} cannot be a quorum queue: quorum queues are durable and "
            "never auto-delete"
        )
    arguments["x-queue-type"] = "quorum"
    return replace(queue, arguments=tuple(sorted(arguments.items())))


def _quorum_policy(policy: Policy, delivery_limit: int) -> Policy:
    definition: dict[str, Any] = {k: v for k, v in policy.definition if k not in _CLASSIC_ONLY_KEYS}
    if "dead-letter-exchange" in definition:
        overflow = definition.get("overflow", "reject-publish")
        if overflow != "reject-publish":
            raise TopologyError(
                f"policy {policy.name!r} sets a DLX with overflow {overflow!r}: at-least-once "
                "dead-lettering needs overflow reject-publish (under drop-head it falls back "
                "to at-most-once)"
            )
        definition["dead-letter-strategy"] = "at-least-once"
        definition["overflow"] = "reject-publish"
        definition.setdefault("delivery-limit", delivery_limit)
    else:
        definition.setdefault("delivery-limit", -1)
    return replace(policy, definition=tuple(sorted(definition.items())))


def _version(text: str) -> tuple[int, int]:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return (99, 0)  # an unreadable version: assume a recent broker


def for_broker(topology: Topology, rabbitmq_version: str) -> Topology:
    """The topology as a broker of ``rabbitmq_version`` (e.g. ``"3.10.8"``, from
    ``/api/overview``) must be given it (pure). Before 4.0 a quorum queue has no delivery limit
    unless one is set, and ``delivery-limit: -1`` is refused ("-1 is not a valid delivery
    limit", seen on 3.10.8): the key is left out there, which means the same, and a policy
    left with nothing else goes too (an empty policy is refused). From 4.0 the default is 20
    and -1 turns it off. Apply and verify both use this, so they agree."""
    if _version(rabbitmq_version) >= (4, 0):
        return topology
    policies = []
    for policy in topology.policies:
        kept = tuple(kv for kv in policy.definition if kv != ("delivery-limit", -1))
        if kept:  # a policy left empty is refused ("no policy provided"): it goes
            policies.append(replace(policy, definition=kept))
    return replace(topology, policies=tuple(policies))
