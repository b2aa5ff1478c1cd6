"""Topology as data: load RabbitMQ definitions-format JSON, apply it idempotently, verify drift.

The data (``topology/definitions.json``) has no vhost fields; it is applied to the vhost of the
settings' URL and to no other. Exchanges, queues and bindings are declared over AMQP
(exchange.declare / queue.declare / queue.bind are idempotent for equal arguments); policies are
PUT through the management API. Dead-lettering is set by policy, never by queue arguments, so
changing the DLX never needs a redeclare (406 inequivalent arg: dramatiq #301, aio-pika #667).
https://www.rabbitmq.com/docs/definitions , https://www.rabbitmq.com/docs/parameters#policies
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika.exceptions as pe

from amqp_lab.connection import close_quietly, connect, translate
from amqp_lab.errors import PreconditionFailed, TopologyError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings

DEFAULT_TOPOLOGY = Path(__file__).resolve().parent.parent / "topology" / "definitions.json"
_QUEUE_ONLY_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key")


def _frozen(mapping: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
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
class Topology:
    """The whole topology: hashable value objects, equal when the data is equal."""

    exchanges: tuple[Exchange, ...] = ()
    queues: tuple[Queue, ...] = ()
    bindings: tuple[Binding, ...] = ()
    policies: tuple[Policy, ...] = ()

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


def load_topology(path: Path | str = DEFAULT_TOPOLOGY) -> Topology:
    """Parse a definitions-format JSON file. Raises TopologyError naming the file and the problem
    (unreadable, not JSON, a missing key, or x-dead-letter-* in queue arguments)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        return topology_from_definitions(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise TopologyError(f"cannot load topology {path}: {type(e).__name__}: {e}") from e


def topology_from_definitions(data: dict[str, Any]) -> Topology:
    """Build a :class:`Topology` from a definitions-format dict (vhost fields are ignored)."""
    queues = tuple(
        Queue(
            q["name"],
            q.get("durable", True),
            q.get("auto_delete", False),
            _frozen(q.get("arguments")),
        )
        for q in data.get("queues", [])
    )
    for queue in queues:
        bad = [k for k, _ in queue.arguments if k in _QUEUE_ONLY_ARGS]
        if bad:
            raise TopologyError(
                f"queue {queue.name!r} sets {bad} as a queue argument: set dead-lettering "
                "with a policy instead"
            )
    return Topology(
        exchanges=tuple(
            Exchange(
                e["name"],
                e.get("type", "direct"),
                e.get("durable", True),
                e.get("auto_delete", False),
                e.get("internal", False),
                _frozen(e.get("arguments")),
            )
            for e in data.get("exchanges", [])
        ),
        queues=queues,
        bindings=tuple(
            Binding(
                b["source"],
                b["destination"],
                b.get("routing_key", ""),
                b.get("destination_type", "queue"),
                _frozen(b.get("arguments")),
            )
            for b in data.get("bindings", [])
        ),
        policies=tuple(
            Policy(
                p["name"],
                p["pattern"],
                _frozen(p["definition"]),
                p.get("priority", 0),
                p.get("apply-to", "queues"),
            )
            for p in data.get("policies", [])
        ),
    )


@dataclass
class ApplyReport:
    """What :func:`apply_topology` changed; ``changed`` is False on an idempotent re-run."""

    created: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created)


def _binding_key(b: dict[str, Any] | Binding) -> tuple[str, str, str, str]:
    if isinstance(b, Binding):
        return (b.source, b.destination, b.destination_type, b.routing_key)
    return (b["source"], b["destination"], b["destination_type"], b["routing_key"])


def apply_topology(
    settings: BrokerSettings, topology: Topology, policy_wait: float = 30.0
) -> ApplyReport:
    """Declare exchanges, queues and bindings over AMQP, then PUT the policies, in the URL's vhost.

    Then waits up to ``policy_wait`` seconds until the management API shows each queue's policy
    as effective, so a --verify right after passes. Idempotent: what already exists with equal
    properties is left alone and reported unchanged.
    Raises PreconditionFailed naming the queue or exchange and the inequivalent argument when the
    live object differs (the connection stays usable), ManagementError when a policy cannot be set
    (e.g. the user lacks the policymaker tag), and BrokerConnectionError subclasses.
    """
    report = ApplyReport()
    vhost = settings.vhost
    with ManagementClient(settings) as api:
        live_bindings = {_binding_key(b) for b in api.bindings(vhost)}
        existing = {
            ("exchange", e.name): api.exchange(vhost, e.name) is not None
            for e in topology.exchanges
        }
        existing.update(
            {("queue", q.name): api.queue(vhost, q.name) is not None for q in topology.queues}
        )
        connection = connect(settings)
        try:
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
                _record(report, f"exchange {exchange.name}", existing[("exchange", exchange.name)])
            for queue in topology.queues:
                channel = _declare(
                    connection,
                    channel,
                    "queue",
                    queue.name,
                    lambda ch, q=queue: ch.queue_declare(
                        q.name,
                        durable=q.durable,
                        auto_delete=q.auto_delete,
                        arguments=dict(q.arguments),
                    ),
                    settings,
                )
                _record(report, f"queue {queue.name}", existing[("queue", queue.name)])
            for binding in topology.bindings:
                channel = _declare(
                    connection,
                    channel,
                    "binding",
                    binding.destination,
                    lambda ch, b=binding: ch.queue_bind(
                        b.destination,
                        b.source,
                        routing_key=b.routing_key,
                        arguments=dict(b.arguments),
                    ),
                    settings,
                )
                name = (
                    f"binding {binding.source} -> {binding.destination} ({binding.routing_key!r})"
                )
                _record(report, name, _binding_key(binding) in live_bindings)
        finally:
            close_quietly(connection)
        for policy in topology.policies:
            live = api.policy(vhost, policy.name)
            same = live is not None and _policy_matches(live, policy)
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
        _wait_effective_policies(api, vhost, topology, policy_wait)
    return report


def _wait_effective_policies(
    api: ManagementClient, vhost: str, topology: Topology, timeout: float
) -> None:
    """Poll until every queue reports its expected policy as effective (the management API
    shows it after the next statistics emission). Raises TopologyError after ``timeout`` s."""
    expected = {q: p.name for q, p in _expected_policy_per_queue(topology).items()}
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
        if e.reply_code == 406:
            raise PreconditionFailed(
                f"{kind} {name!r} already exists with different properties: {e.reply_text}. "
                f"Fix: change the topology data to match, or delete the {kind} (its messages "
                "are lost) and re-run; dead-letter settings belong in a policy, not in "
                "arguments",
                406,
            ) from e
        raise translate(e, settings) from e
    except Exception as e:
        raise translate(e, settings) from e


def _policy_matches(live: dict[str, Any], policy: Policy) -> bool:
    return (
        live.get("pattern") == policy.pattern
        and live.get("definition") == policy.definition_dict
        and live.get("priority") == policy.priority
        and live.get("apply-to") == policy.apply_to
    )


def verify_topology(
    settings: BrokerSettings, topology: Topology, stats_wait: float = 15.0
) -> list[str]:
    """Compare the live vhost with the data through the management API; return drift lines
    (empty when in sync). Checks exchange type and durability, queue durability and arguments,
    bindings, policies, and each queue's *effective* policy (the one RabbitMQ applied).

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
        for exchange in topology.exchanges:
            live = api.exchange(vhost, exchange.name)
            if live is None:
                drift.append(f"exchange {exchange.name!r} is missing")
            elif live["type"] != exchange.type or live["durable"] != exchange.durable:
                drift.append(
                    f"exchange {exchange.name!r} is {live['type']} durable={live['durable']}, "
                    f"expected {exchange.type} durable={exchange.durable}"
                )
        policies_by_queue = _expected_policy_per_queue(topology)
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
        live_bindings = {_binding_key(b) for b in api.bindings(vhost)}
        for binding in topology.bindings:
            if _binding_key(binding) not in live_bindings:
                drift.append(
                    f"binding {binding.source} -> {binding.destination} "
                    f"({binding.routing_key!r}) is missing"
                )
        for policy in topology.policies:
            live = api.policy(vhost, policy.name)
            if live is None:
                drift.append(f"policy {policy.name!r} is missing")
            elif not _policy_matches(live, policy):
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


def _expected_policy_per_queue(topology: Topology) -> dict[str, Policy]:
    """Which policy RabbitMQ should apply to each queue: the highest-priority match."""
    policies = {q.name: topology.policy_for(q.name) for q in topology.queues}
    return {name: policy for name, policy in policies.items() if policy is not None}
