"""Checking a live vhost against the topology data: what is missing or differs, including
each queue's *effective* policy (the one RabbitMQ applied)."""

from __future__ import annotations

import time
from typing import Any

from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology.model import (
    Queue,
    Topology,
    binding_key,
    expected_policy_per_queue,
    policy_matches,
)
from amqp_lab.topology.queue_type import for_broker

__all__ = ["live_queue_arguments", "verify_topology"]


def verify_topology(
    settings: BrokerSettings, topology: Topology, stats_wait: float = 15.0
) -> list[str]:
    """Compare the live vhost with the data through the management API; return drift lines
    (empty when in sync). Checks exchange type and durability, queue durability and arguments,
    bindings, policies, and each queue's *effective* policy (the one RabbitMQ applied), with the
    topology adapted to the broker's version (:func:`for_broker`).

    A queue's effective policy is reported by the statistics the broker emits, which are empty
    for a few seconds after a policy change or a broker restart; while some queue shows no
    policy at all, the check is repeated for up to ``stats_wait`` seconds before it counts."""
    deadline = time.monotonic() + stats_wait
    while True:
        drift = _verify_once(settings, topology)
        # policies all present, yet a queue reports none: its statistics are not in yet
        pending_stats = any("effective policy is None" in line for line in drift) and not any(
            line.startswith("policy ") for line in drift
        )
        if not pending_stats or time.monotonic() > deadline:
            return drift
        time.sleep(0.5)


def _verify_once(settings: BrokerSettings, topology: Topology) -> list[str]:
    drift: list[str] = []
    vhost = settings.vhost
    with ManagementClient(settings) as api:
        topology = for_broker(topology, str(api.overview().get("rabbitmq_version", "")))
        for exchange in topology.exchanges:
            live = api.exchange(vhost, exchange.name)
            if live is None:
                drift.append(f"exchange {exchange.name!r} is missing")
            elif live["type"] != exchange.type or live["durable"] != exchange.durable:
                drift.append(
                    f"exchange {exchange.name!r} is {live['type']} durable={live['durable']}, "
                    f"expected {exchange.type} durable={exchange.durable}"
                )
        policies_by_queue = expected_policy_per_queue(topology)
        for queue in topology.queues:
            live = api.queue(vhost, queue.name)
            if live is None:
                drift.append(f"queue {queue.name!r} is missing")
                continue
            if live["durable"] != queue.durable:
                drift.append(
                    f"queue {queue.name!r} durable={live['durable']}, expected {queue.durable}"
                )
            if live_queue_arguments(live, queue) != dict(queue.arguments):
                drift.append(
                    f"queue {queue.name!r} arguments {live.get('arguments')} differ from "
                    f"{dict(queue.arguments)}"
                )
            expected = policies_by_queue.get(queue.name)
            effective = live.get("policy") or None
            if expected is not None and effective != expected.name:
                drift.append(
                    f"queue {queue.name!r} effective policy is {effective!r}, "
                    f"expected {expected.name!r}"
                )
            elif expected is not None:
                effective_def = live.get("effective_policy_definition") or {}
                for key, value in expected.definition:
                    if effective_def.get(key) != value:
                        drift.append(
                            f"queue {queue.name!r} effective {key}={effective_def.get(key)!r}, "
                            f"expected {value!r}"
                        )
        live_bindings = {binding_key(b) for b in api.bindings(vhost)}
        for binding in topology.bindings:
            if binding_key(binding) not in live_bindings:
                drift.append(
                    f"binding {binding.source} -> {binding.destination} "
                    f"({binding.routing_key!r}) is missing"
                )
        for policy in topology.policies:
            live = api.policy(vhost, policy.name)
            if live is None:
                drift.append(f"policy {policy.name!r} is missing")
            elif not policy_matches(live, policy):
                drift.append(f"policy {policy.name!r} differs: live {live.get('definition')}")
    return drift


def live_queue_arguments(live: dict[str, Any], queue: Queue) -> dict[str, Any]:
    """The live queue's arguments as our data would write them. RabbitMQ 4.x records
    ``x-queue-type: classic`` on a queue declared without a type; 3.x records nothing. Both mean
    the same queue, so that default is dropped unless the data sets a type."""
    arguments = dict(live.get("arguments") or {})
    if "x-queue-type" not in dict(queue.arguments) and arguments.get("x-queue-type") == "classic":
        del arguments["x-queue-type"]
    return arguments
