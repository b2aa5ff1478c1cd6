"""A topology as a definitions file (pure): the inverse of
:func:`~amqp_lab.topology.load.load_topology`, so a variant derived in code (quorum, ordered)
can be written down, read by people, diffed, and loaded back equal.

The layout is the one of the files amqp-lab ships: one top-level key per line, one object
per line inside each list; ``load_topology(path)`` of what :func:`render_definitions` wrote
equals the topology it was given.
"""

from __future__ import annotations

import json
from typing import Any

from amqp_lab.topology.model import Names, Topology

__all__ = ["definitions_of", "render_definitions", "section_of"]


def section_of(names: Names) -> dict[str, Any]:
    """The ``"amqp_lab"`` section naming ``names``' roles (optional roles left out when unset)."""
    section: dict[str, Any] = {
        "exchange": names.exchange,
        "routing_key": names.routing_key,
        "queue": names.queue,
        "dead_letter_exchange": names.dead_letter_exchange,
        "dlq": names.dlq,
    }
    optional: dict[str, Any] = {
        "retry_exchange": names.retry_exchange,
        "wait_queue": names.wait_queue_template,
        "wait_queues": names.wait_queues or None,
        "audit_queue": names.audit_queue,
        "shard_queue": names.shard_queue_template,
        "shards": names.shards or None,
    }
    section.update({k: v for k, v in optional.items() if v is not None})
    return section


def definitions_of(topology: Topology, comment: str | None = None) -> dict[str, Any]:
    """``topology`` in RabbitMQ's definitions format without vhost fields, with its
    ``"amqp_lab"`` section when it has names, and ``_comment`` first when given."""
    data: dict[str, Any] = {}
    if comment is not None:
        data["_comment"] = comment
    if topology.named is not None:
        data["amqp_lab"] = section_of(topology.named)
    data["exchanges"] = [
        {
            "name": e.name,
            "type": e.type,
            "durable": e.durable,
            "auto_delete": e.auto_delete,
            "internal": e.internal,
            "arguments": dict(e.arguments),
        }
        for e in topology.exchanges
    ]
    data["queues"] = [
        {
            "name": q.name,
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "arguments": dict(q.arguments),
        }
        for q in topology.queues
    ]
    data["bindings"] = [
        {
            "source": b.source,
            "destination": b.destination,
            "destination_type": b.destination_type,
            "routing_key": b.routing_key,
            "arguments": dict(b.arguments),
        }
        for b in topology.bindings
    ]
    data["policies"] = [
        {
            "name": p.name,
            "pattern": p.pattern,
            "apply-to": p.apply_to,
            "priority": p.priority,
            "definition": p.definition_dict,
        }
        for p in topology.policies
    ]
    return data


def render_definitions(topology: Topology, comment: str | None = None) -> str:
    """:func:`definitions_of` as the text of a file (UTF-8, ending in a newline)."""
    data = definitions_of(topology, comment)
    lines = []
    for key, value in data.items():
        if isinstance(value, list):
            items = ",\n".join(f"    {_compact(item)}" for item in value)
            text = f"[\n{items}\n  ]" if value else "[]"
            lines.append(f"  {json.dumps(key)}: {text}")
        else:
            lines.append(f"  {json.dumps(key)}: {_compact(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
