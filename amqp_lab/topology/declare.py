"""Applying a topology: exchanges, queues and bindings declared over AMQP (idempotent for equal
arguments), policies PUT through the management API, in the URL's vhost only. Dead-lettering
is set by policy, never by queue arguments, so changing the DLX never needs a redeclare (406
inequivalent arg: dramatiq #301, aio-pika #667).
https://www.rabbitmq.com/docs/parameters#policies
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import close_quietly, connect, translate
from amqp_lab.errors import (
    AccessRefused,
    ChannelError,
    NotFound,
    PreconditionFailed,
    TopologyError,
)
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology.model import (
    Binding,
    Topology,
    binding_key,
    expected_policy_per_queue,
    policy_matches,
)
from amqp_lab.topology.queue_type import for_broker

__all__ = ["ApplyReport", "apply_topology"]


@dataclass
class ApplyReport:
    """What :func:`apply_topology` changed; ``changed`` is False on an idempotent re-run."""

    created: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created)


def apply_topology(
    settings: BrokerSettings, topology: Topology, policy_wait: float = 30.0
) -> ApplyReport:
    """Declare exchanges, queues and bindings over AMQP, then PUT the policies, in the URL's vhost.

    The topology is first adapted to the broker's version (:func:`for_broker`). Then waits up to
    ``policy_wait`` seconds until the management API shows each queue's policy
    as effective, so a --verify right after passes. Idempotent: what already exists with equal
    properties is left alone and reported unchanged.
    Raises PreconditionFailed naming the queue or exchange and the inequivalent argument when the
    live object differs (the connection stays usable), ManagementError when a policy cannot be set
    (e.g. the user lacks the policymaker tag), and BrokerConnectionError subclasses.
    """
    report = ApplyReport()
    with ManagementClient(settings) as api:
        topology = for_broker(topology, str(api.overview().get("rabbitmq_version", "")))
        existing = _existing(api, settings.vhost, topology)
        connection = connect(settings)
        try:
            _declare_all(connection, settings, topology, existing, report)
        finally:
            close_quietly(connection)
        _put_policies(api, settings.vhost, topology, report)
        _wait_effective_policies(api, settings.vhost, topology, policy_wait)
    return report


def _existing(api: ManagementClient, vhost: str, topology: Topology) -> set[tuple[str, Any]]:
    """What of the topology the vhost has already: ("exchange", name), ("queue", name) and
    ("binding", binding key) entries."""
    found: set[tuple[str, Any]] = {("binding", binding_key(b)) for b in api.bindings(vhost)}
    found |= {
        ("exchange", e.name) for e in topology.exchanges if api.exchange(vhost, e.name) is not None
    }
    found |= {("queue", q.name) for q in topology.queues if api.queue(vhost, q.name) is not None}
    return found


def _declare_all(
    connection: Any,
    settings: BrokerSettings,
    topology: Topology,
    existing: set[tuple[str, Any]],
    report: ApplyReport,
) -> None:
    """exchange.declare, queue.declare and the bindings, in that order, on one connection."""
    channel = connection.channel()
    for exchange in topology.exchanges:
        channel = _declare(
            connection,
            channel,
            "exchange",
            exchange.name,
            lambda ch, x=exchange: ch.exchange_declare(
                x.name,
                x.type,
                durable=x.durable,
                auto_delete=x.auto_delete,
                internal=x.internal,
                arguments=dict(x.arguments),
            ),
            settings,
        )
        _record(report, f"exchange {exchange.name}", ("exchange", exchange.name) in existing)
    for queue in topology.queues:
        channel = _declare(
            connection,
            channel,
            "queue",
            queue.name,
            lambda ch, q=queue: ch.queue_declare(
                q.name, durable=q.durable, auto_delete=q.auto_delete, arguments=dict(q.arguments)
            ),
            settings,
        )
        _record(report, f"queue {queue.name}", ("queue", queue.name) in existing)
    for binding in topology.bindings:
        channel = _declare_binding(connection, channel, binding, settings)
        name = f"binding {binding.source} -> {binding.destination} ({binding.routing_key!r})"
        _record(report, name, ("binding", binding_key(binding)) in existing)


def _put_policies(
    api: ManagementClient, vhost: str, topology: Topology, report: ApplyReport
) -> None:
    """PUT each policy that differs from the live one (management API)."""
    for policy in topology.policies:
        live = api.policy(vhost, policy.name)
        same = live is not None and policy_matches(live, policy)
        if not same:
            api.put_policy(
                vhost,
                policy.name,
                policy.pattern,
                policy.definition_dict,
                policy.priority,
                policy.apply_to,
            )
        _record(report, f"policy {policy.name}", same)


def _wait_effective_policies(
    api: ManagementClient, vhost: str, topology: Topology, timeout: float
) -> None:
    """Poll until every queue reports its expected policy as effective (the management API
    shows it after the next statistics emission). Raises TopologyError after ``timeout`` s."""
    expected = {q: p.name for q, p in expected_policy_per_queue(topology).items()}
    deadline = time.monotonic() + timeout
    while True:
        pending = {
            q: name
            for q, name in expected.items()
            if ((api.queue(vhost, q) or {}).get("policy") or None) != name
        }
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TopologyError(
                f"policies not effective after {timeout:.0f}s: "
                + ", ".join(f"{q} (expected {n})" for q, n in pending.items())
            )
        time.sleep(0.25)


def _unknown_exchange_type(kind: str, name: str, reply_text: str) -> TopologyError:
    """The broker refused an exchange type it does not know: 406 on the channel (4.3) or 503
    on the connection (older releases)."""
    return TopologyError(
        f"{kind} {name!r}: the broker does not know the exchange type ({reply_text}); the "
        "ordered topology's x-consistent-hash exchange needs the plugin: rabbitmq-plugins "
        "enable rabbitmq_consistent_hash_exchange"
    )


def _bind(channel: Any, binding: Binding) -> None:
    """queue.bind, or exchange.bind for an exchange-to-exchange binding
    (https://www.rabbitmq.com/docs/e2e)."""
    if binding.destination_type == "exchange":
        channel.exchange_bind(
            binding.destination,
            binding.source,
            routing_key=binding.routing_key,
            arguments=dict(binding.arguments),
        )
        return
    channel.queue_bind(
        binding.destination,
        binding.source,
        routing_key=binding.routing_key,
        arguments=dict(binding.arguments),
    )


def _declare_binding(
    connection: Any, channel: Any, binding: Binding, settings: BrokerSettings
) -> Any:
    """Declare one binding; a refusal names it by source, destination and routing key (a 404
    alone would name only the exchange or queue that is missing)."""
    try:
        return _declare(
            connection, channel, "binding", binding.label, lambda ch: _bind(ch, binding), settings
        )
    except ChannelError as e:
        if type(e) not in (ChannelError, PreconditionFailed, NotFound, AccessRefused):
            raise
        raise type(e)(f"binding {binding.label}: {e}", e.reply_code) from e


def _record(report: ApplyReport, name: str, existed: bool) -> None:
    (report.unchanged if existed else report.created).append(name)


def _declare(
    connection: Any, channel: Any, kind: str, name: str, action: Any, settings: BrokerSettings
) -> Any:
    """Run one declare; on a channel error open a fresh channel and raise a clear error."""
    try:
        action(channel)
        return channel
    except pe.ChannelClosedByBroker as e:
        if "unknown exchange type" in str(e.reply_text):  # 4.3: 406 on the channel
            raise _unknown_exchange_type(kind, name, str(e.reply_text)) from e
        if e.reply_code == 406:
            raise PreconditionFailed(
                f"{kind} {name!r} already exists with different properties: {e.reply_text}. "
                f"Fix: change the topology data to match, or delete the {kind} (its messages "
                "are lost) and re-run; dead-letter settings belong in a policy, not in "
                "arguments",
                406,
            ) from e
        raise translate(e, settings) from e
    except pe.ConnectionClosedByBroker as e:
        if "unknown exchange type" in str(e.reply_text):
            raise _unknown_exchange_type(kind, name, str(e.reply_text)) from e
        raise translate(e, settings) from e
    except Exception as e:
        raise translate(e, settings) from e
