"""Loading topology data: RabbitMQ's definitions format, without vhost fields, plus an
``amqp_lab`` section that names the roles (:class:`~amqp_lab.topology.model.Names`). A file
is checked against the topology JSON Schema first (:mod:`amqp_lab.topology.schema`). The
topology amqp-lab ships (``data/definitions.json``, package data: the same file as the
repository's ``topology/definitions.json``) is :data:`DEFAULT_TOPOLOGY`.
https://www.rabbitmq.com/docs/definitions
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from amqp_lab.errors import TopologyError
from amqp_lab.topology.model import Binding, Exchange, Names, Policy, Queue, Topology, frozen_items
from amqp_lab.topology.schema import check_definitions

__all__ = ["DATA", "DEFAULT_TOPOLOGY", "load_topology", "topology_from_definitions"]

DATA = Path(__file__).resolve().parent / "data"
"""The topology files the package ships (the repository's ``topology/``, copied)."""
DEFAULT_TOPOLOGY = DATA / "definitions.json"
_QUEUE_ONLY_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key")


def load_topology(path: Path | str = DEFAULT_TOPOLOGY) -> Topology:
    """Read a definitions-format JSON file and check it against the topology schema
    (:func:`~amqp_lab.topology.schema.check_definitions`). Raises TopologyError naming the
    file and the problem in one line: unreadable, not JSON, no ``"amqp_lab"`` section, an
    unknown role, a field of the wrong type, a binding to an object the file does not declare
    (named by source, destination and routing key), or x-dead-letter-* in queue arguments."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TopologyError(f"cannot load topology {path}: {type(e).__name__}: {e}") from e
    try:
        check_definitions(data)
    except TopologyError as e:
        raise TopologyError(f"cannot load topology {path}: {e}") from e
    try:
        return topology_from_definitions(data)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise TopologyError(f"cannot load topology {path}: {type(e).__name__}: {e}") from e


def topology_from_definitions(data: dict[str, Any]) -> Topology:
    """Build a :class:`Topology` from a definitions-format dict (vhost fields are ignored), as
    given: unlike :func:`load_topology` it does not check the schema, so a program may build
    a partial topology (no ``amqp_lab`` section: ``topology.names`` then raises)."""
    queues = tuple(
        Queue(
            q["name"],
            q.get("durable", True),
            q.get("auto_delete", False),
            frozen_items(q.get("arguments")),
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
    topology = Topology(
        exchanges=tuple(
            Exchange(
                e["name"],
                e.get("type", "direct"),
                e.get("durable", True),
                e.get("auto_delete", False),
                e.get("internal", False),
                frozen_items(e.get("arguments")),
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
                frozen_items(b.get("arguments")),
            )
            for b in data.get("bindings", [])
        ),
        policies=tuple(
            Policy(
                p["name"],
                p["pattern"],
                frozen_items(p["definition"]),
                p.get("priority", 0),
                p.get("apply-to", "queues"),
            )
            for p in data.get("policies", [])
        ),
        named=_names(data.get("amqp_lab")),
    )
    _check_names(topology)
    return topology


_NAME_KEYS = ("exchange", "routing_key", "queue", "dead_letter_exchange", "dlq")


def _names(section: Any) -> Names | None:
    """The ``amqp_lab`` section of a definitions file as :class:`Names` (None when absent)."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise TopologyError('the "amqp_lab" section must be an object')
    missing = [key for key in _NAME_KEYS if not isinstance(section.get(key), str)]
    if missing:
        raise TopologyError(f'the "amqp_lab" section does not name {", ".join(missing)}')
    template = section.get("wait_queue")
    if template is not None and (not isinstance(template, str) or "{n}" not in template):
        raise TopologyError('"wait_queue" must be a queue name template with {n}')
    count = section.get("wait_queues", 0)
    if not isinstance(count, int) or count < 0 or (count and template is None):
        raise TopologyError('"wait_queues" must be a count >= 0, with a "wait_queue"')
    shard_template = section.get("shard_queue")
    if shard_template is not None and (
        not isinstance(shard_template, str) or "{n}" not in shard_template
    ):
        raise TopologyError('"shard_queue" must be a queue name template with {n}')
    shards = section.get("shards", 0)
    if not isinstance(shards, int) or shards < 0 or (shards and shard_template is None):
        raise TopologyError('"shards" must be a count >= 0, with a "shard_queue"')
    return Names(
        exchange=section["exchange"],
        routing_key=section["routing_key"],
        queue=section["queue"],
        dead_letter_exchange=section["dead_letter_exchange"],
        dlq=section["dlq"],
        retry_exchange=section.get("retry_exchange"),
        wait_queue_template=template,
        wait_queues=count,
        audit_queue=section.get("audit_queue"),
        shard_queue_template=shard_template,
        shards=shards,
    )


def _check_names(topology: Topology) -> None:
    """Every name of the ``amqp_lab`` section is an object of the topology."""
    names = topology.named
    if names is None:
        return
    exchanges = {e.name for e in topology.exchanges} | {""}
    queues = {q.name for q in topology.queues}
    wanted = [
        ("exchange", names.exchange, exchanges),
        ("dead_letter_exchange", names.dead_letter_exchange, exchanges),
        ("queue", names.queue, queues),
        ("dlq", names.dlq, queues),
    ]
    if names.retry_exchange is not None:
        wanted.append(("retry_exchange", names.retry_exchange, exchanges))
    if names.audit_queue is not None:
        wanted.append(("audit_queue", names.audit_queue, queues))
    wanted += [
        (f"wait queue {n}", names.wait_queue(n), queues) for n in range(1, names.wait_queues + 1)
    ]
    wanted += [
        (f"shard queue {n}", names.shard_queue(n), queues) for n in range(1, names.shards + 1)
    ]
    unknown = [f"{role} {name!r}" for role, name, known in wanted if name not in known]
    if unknown:
        raise TopologyError(
            'the "amqp_lab" section names what the topology does not declare: ' + ", ".join(unknown)
        )
