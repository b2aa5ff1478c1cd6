"""The ordered variant of a topology (pure): per-key order by sharding on an entity key.

Global order costs all parallelism; what is usually needed is order *per key* (per order,
per account). :func:`with_ordered` adds to a topology:

* an entry exchange ``<exchange>.ordered`` (fanout) that publishers of the ordered variant
  use, with the message's key as the routing key (:func:`amqp_lab.message.message_for`
  ``key=``); it copies every message to the audit queue, if any, and, by an
  exchange-to-exchange binding (https://www.rabbitmq.com/docs/e2e), to
* a consistent-hash exchange ``<exchange>.ordered.shards`` (``x-consistent-hash``, the
  rabbitmq_consistent_hash_exchange plugin shipped with every RabbitMQ we test,
  https://github.com/rabbitmq/rabbitmq-server/tree/main/deps/rabbitmq_consistent_hash_exchange)
  that hashes the routing key onto
* ``shards`` shard queues ``<queue>:shard:<n>``, each bound with the same weight (the binding
  key is the number of points the queue gets on the hash ring: more points, a more even
  spread) and declared with ``x-single-active-consumer: true``: however many workers
  subscribe, the broker delivers a shard to one of them at a time, and a standby takes over
  when the active one goes (https://www.rabbitmq.com/docs/consumers#single-active-consumer).
  Single active consumer can only be a declare argument, not a policy.

Every message of one key lands on one shard and is delivered in publish order to one
consumer; :class:`amqp_lab.ordering.OrderedConsumer` keeps that order through retries. The
shards get the work queue's policy (its DLX and queue-mode) under a policy of their own. The
base topology stays as it was: both variants can live in one vhost. A key shared by too many
messages makes a hot shard: ``scripts/keys.py report`` checks a sample first (docs/ordering.md).
"""

from __future__ import annotations

import re
from dataclasses import replace

from amqp_lab.errors import TopologyError
from amqp_lab.topology.model import Binding, Exchange, Policy, Queue, Topology

__all__ = ["DEFAULT_SHARDS", "DEFAULT_WEIGHT", "HASH_EXCHANGE_TYPE", "is_ordered", "with_ordered"]

DEFAULT_SHARDS = 4
DEFAULT_WEIGHT = 20
HASH_EXCHANGE_TYPE = "x-consistent-hash"
SINGLE_ACTIVE_CONSUMER = "x-single-active-consumer"


def is_ordered(topology: Topology) -> bool:
    """Whether the topology is the ordered variant (its names have shard queues)."""
    return topology.named is not None and topology.named.shards > 0


def with_ordered(
    topology: Topology, shards: int = DEFAULT_SHARDS, weight: int = DEFAULT_WEIGHT
) -> Topology:
    """The ordered variant of ``topology`` (see the module docstring): the names' ``exchange``
    becomes the entry exchange and ``routing_key`` is empty (each message's key is its routing
    key), ``shard_queue_template``/``shards`` name the shard queues. Apply it before
    :func:`~amqp_lab.topology.queue_type.with_queue_type` or after: the shards are ordinary
    durable queues. Raises TopologyError for ``shards`` outside 1..1000, a ``weight`` below 1,
    or a topology that is ordered already."""
    if not 1 <= shards <= 1000:
        raise TopologyError(f"shards must be within 1..1000, not {shards}")
    if weight < 1:
        raise TopologyError(f"the hash ring weight must be >= 1, not {weight}")
    names = topology.names
    if names.shards:
        raise TopologyError("the topology is ordered already")
    entry, ring = f"{names.exchange}.ordered", f"{names.exchange}.ordered.shards"
    template = names.queue + ":shard:{n}"
    queue_type = dict(topology.queue(names.queue).arguments).get("x-queue-type")
    shard_arguments: dict[str, object] = {SINGLE_ACTIVE_CONSUMER: True}
    if queue_type is not None:
        shard_arguments["x-queue-type"] = queue_type
    shard_queues = tuple(
        Queue(template.format(n=n), arguments=tuple(sorted(shard_arguments.items())))
        for n in range(1, shards + 1)
    )
    bindings = [Binding(entry, ring, "", destination_type="exchange")]
    if names.audit_queue is not None:
        bindings.append(Binding(entry, names.audit_queue, ""))
    bindings += [Binding(ring, q.name, str(weight)) for q in shard_queues]
    work_policy = topology.policy_for(names.queue)
    policies = topology.policies
    if work_policy is not None:
        escaped = re.escape(names.queue)
        policies += (
            Policy(
                f"{work_policy.name}-shards",
                f"^{escaped}:shard:\\d+$",
                work_policy.definition,
                work_policy.priority,
                work_policy.apply_to,
            ),
        )
    return replace(
        topology,
        exchanges=(
            *topology.exchanges,
            Exchange(entry, "fanout"),
            Exchange(ring, HASH_EXCHANGE_TYPE),
        ),
        queues=topology.queues + shard_queues,
        bindings=topology.bindings + tuple(bindings),
        policies=policies,
        named=replace(
            names, exchange=entry, routing_key="", shard_queue_template=template, shards=shards
        ),
    )
