"""Topology as data: RabbitMQ definitions (exchanges, queues, bindings, policies) with the
:class:`Names` of their roles, applied idempotently to one vhost and checked against it.
"""

from amqp_lab.topology.declare import ApplyReport, apply_topology
from amqp_lab.topology.load import DEFAULT_TOPOLOGY, load_topology, topology_from_definitions
from amqp_lab.topology.model import Binding, Exchange, Names, Policy, Queue, Topology
from amqp_lab.topology.queue_type import (
    DEFAULT_DELIVERY_LIMIT,
    QUEUE_TYPES,
    QueueType,
    for_broker,
    queue_type_of,
    with_queue_type,
)
from amqp_lab.topology.stream_audit import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_LENGTH_BYTES,
    DEFAULT_MAX_SEGMENT_SIZE_BYTES,
    is_stream,
    with_stream_audit,
)
from amqp_lab.topology.verify import live_queue_arguments, verify_topology

__all__ = [
    "DEFAULT_DELIVERY_LIMIT",
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_LENGTH_BYTES",
    "DEFAULT_MAX_SEGMENT_SIZE_BYTES",
    "DEFAULT_TOPOLOGY",
    "QUEUE_TYPES",
    "ApplyReport",
    "Binding",
    "Exchange",
    "Names",
    "Policy",
    "Queue",
    "QueueType",
    "Topology",
    "apply_topology",
    "for_broker",
    "is_stream",
    "live_queue_arguments",
    "load_topology",
    "queue_type_of",
    "topology_from_definitions",
    "verify_topology",
    "with_queue_type",
    "with_stream_audit",
]
