"""The topology as values: hashable exchanges, queues, bindings and policies, and the
:class:`Names` that give their roles (work queue, DLX, DLQ, wait queues...)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from amqp_lab.errors import TopologyError

__all__ = [
    "Binding",
    "Exchange",
    "Names",
    "Policy",
    "Queue",
    "Topology",
    "binding_key",
    "expected_policy_per_queue",
    "policy_matches",
]


def frozen_items(mapping: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((mapping or {}).items()))


@dataclass(frozen=True)
class Exchange:
    name: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Queue:
    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Binding:
    source: str
    destination: str
    routing_key: str = ""
    destination_type: str = "queue"
    arguments: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """``source -> destination (routing key 'rk')``: how errors name the binding."""
        return f"{self.source} -> {self.destination} (routing key {self.routing_key!r})"


@dataclass(frozen=True)
class Policy:
    name: str
    pattern: str
    definition: tuple[tuple[str, Any], ...]
    priority: int = 0
    apply_to: str = "queues"

    @property
    def definition_dict(self) -> dict[str, Any]:
        return dict(self.definition)


@dataclass(frozen=True)
class Names:
    """The roles amqp-lab's consumer, DLQ tools and scripts give the topology's objects: every
    name they use comes from here, so another topology file with other names works with the
    same code (``"amqp_lab"`` section of a definitions file, read by :func:`load_topology`).

    ``exchange`` / ``routing_key``: where messages are published; ``queue``: the work queue;
    ``dead_letter_exchange`` and ``dlq``: where dead-lettered messages go; ``retry_exchange``:
    where expired retries go back to the work queue from; ``wait_queue``: the template of the
    wait queue names, with ``{n}`` for the attempt number, and ``wait_queues``: how many there
    are (1..wait_queues); ``audit_queue``: a copy of everything, if any. The ordered variant
    (:func:`amqp_lab.topology.ordered.with_ordered`) adds ``shard_queue_template`` (with
    ``{n}``) and ``shards``: the shard queues 1..shards a hashing exchange spreads keys over."""

    exchange: str
    routing_key: str
    queue: str
    dead_letter_exchange: str
    dlq: str
    retry_exchange: str | None = None
    wait_queue_template: str | None = None
    wait_queues: int = 0
    audit_queue: str | None = None
    shard_queue_template: str | None = None
    shards: int = 0

    def shard_queue(self, n: int) -> str:
        """Shard queue ``n`` (1-based) of the ordered variant. Raises TopologyError when the
        topology has no shard ``n``."""
        if self.shard_queue_template is None or not 1 <= n <= self.shards:
            raise TopologyError(
                f"the topology has no shard queue {n} (it has {self.shards}): apply the "
                "ordered variant (setup_topology.py --ordered SHARDS)"
            )
        return self.shard_queue_template.format(n=n)

    @property
    def shard_queues(self) -> tuple[str, ...]:
        """Every shard queue, in shard order (empty outside the ordered variant)."""
        return tuple(self.shard_queue(n) for n in range(1, self.shards + 1))

    def wait_queue(self, n: int) -> str:
        """The wait queue holding messages after their ``n``-th failure (1-based). Raises
        TopologyError when the topology has no wait queue ``n``."""
        if self.wait_queue_template is None or not 1 <= n <= self.wait_queues:
            raise TopologyError(
                f"the topology has no wait queue {n} (it has {self.wait_queues}): "
                "lower --max-attempts or add wait queues"
            )
        return self.wait_queue_template.format(n=n)

    @property
    def max_attempts(self) -> int:
        """The most deliveries a broker-held retry policy can give: one per wait queue, plus
        the first."""
        return self.wait_queues + 1


@dataclass(frozen=True)
class Topology:
    """The whole topology: hashable value objects, equal when the data is equal. ``names``:
    the roles of its objects (None when the data has no ``amqp_lab`` section)."""

    exchanges: tuple[Exchange, ...] = ()
    queues: tuple[Queue, ...] = ()
    bindings: tuple[Binding, ...] = ()
    policies: tuple[Policy, ...] = ()
    named: Names | None = None

    @property
    def names(self) -> Names:
        """The roles of the topology's objects. Raises TopologyError when the data does not
        name them (no ``amqp_lab`` section)."""
        if self.named is None:
            raise TopologyError(
                'the topology names no roles: add an "amqp_lab" section (exchange, '
                "routing_key, queue, dead_letter_exchange, dlq...) to its definitions file"
            )
        return self.named

    def longest_wait(self) -> float | None:
        """The longest a message can wait in a wait queue, in seconds: the smallest
        ``message-ttl`` the policies give the wait queues (None when no policy bounds them).
        A retry policy's cap must not exceed it."""
        names = self.names
        ttls = []
        for n in range(1, names.wait_queues + 1):
            policy = self.policy_for(names.wait_queue(n))
            ttl = policy.definition_dict.get("message-ttl") if policy is not None else None
            if isinstance(ttl, int | float):
                ttls.append(ttl / 1000.0)
        return min(ttls) if ttls else None

    def queue(self, name: str) -> Queue:
        for queue in self.queues:
            if queue.name == name:
                return queue
        raise TopologyError(f"topology has no queue {name!r}")

    def policy_for(self, queue_name: str) -> Policy | None:
        """The policy RabbitMQ applies to a queue of that name: of those whose pattern matches
        (``re.search``) and that apply to queues, the one of highest priority; None if none.
        Only one policy ever applies to a queue: https://www.rabbitmq.com/docs/policies. Among
        equal priorities RabbitMQ's choice is unspecified (here: the first in the data), and
        operator policies, which the broker merges in, are not part of the topology."""
        matches = [
            p
            for p in self.policies
            if p.apply_to in ("queues", "all") and re.search(p.pattern, queue_name)
        ]
        return max(matches, key=lambda p: p.priority) if matches else None


def binding_key(b: dict[str, Any] | Binding) -> tuple[str, str, str, str]:
    """(source, destination, destination_type, routing_key) of a binding, ours or the API's."""
    if isinstance(b, Binding):
        return (b.source, b.destination, b.destination_type, b.routing_key)
    return (b["source"], b["destination"], b["destination_type"], b["routing_key"])


def policy_matches(live: dict[str, Any], policy: Policy) -> bool:
    """Whether a policy read from the management API equals ours."""
    return (
        live.get("pattern") == policy.pattern
        and live.get("definition") == policy.definition_dict
        and live.get("priority") == policy.priority
        and live.get("apply-to") == policy.apply_to
    )


def expected_policy_per_queue(topology: Topology) -> dict[str, Policy]:
    """Which policy RabbitMQ should apply to each queue: the highest-priority match."""
    policies = {q.name: topology.policy_for(q.name) for q in topology.queues}
    return {name: policy for name, policy in policies.items() if policy is not None}
