"""Topology as data: RabbitMQ definitions (exchanges, queues, bindings, policies) with the
:class:`Names` of their roles, applied idempotently to one vhost and checked against it.
"""

from amqp_lab.topology.declare import ApplyReport, apply_topology
from amqp_lab.topology.load import DEFAULT_TOPOLOGY, load_topology, topology_from_definitions
from amqp_lab.topology.model import Binding, Exchange, Names, Policy, Queue, Topology
from amqp_lab.topology.verify import live_queue_arguments, verify_topology

__all__ = [
    "DEFAULT_TOPOLOGY",
    "ApplyReport",
    "Binding",
    "Exchange",
    "Names",
    "Policy",
    "Queue",
    "Topology",
    "apply_topology",
    "live_queue_arguments",
    "load_topology",
    "topology_from_definitions",
    "verify_topology",
]
