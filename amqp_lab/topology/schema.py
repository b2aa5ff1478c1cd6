"""What a topology file must be (pure): its JSON Schema (``schema.json``, package data,
checked with the ``jsonschema`` package) and the checks a schema cannot express - every
binding joins objects the file declares, a queue's ``type`` agrees with its ``x-queue-type``.

:func:`check_definitions` refuses a file in one line naming the field: no ``"amqp_lab"``
section, an unknown role in it, a field of the wrong type or an unknown field on an exchange,
queue, binding or policy (a typo such as ``durabel`` would otherwise be ignored and the
queue declared with the default), a bad binding - named by its source, destination and
routing key. Files are treated as hostile: the line quotes at most a short, escaped piece of
any value. https://www.rabbitmq.com/docs/definitions, https://json-schema.org
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from amqp_lab.errors import TopologyError
from amqp_lab.oneline import one_line

__all__ = ["ROLES", "SCHEMA", "binding_label", "check_definitions", "schema"]

SCHEMA = Path(__file__).resolve().parent / "schema.json"
"""The topology file's JSON Schema (draft 2020-12), package data."""
ROLES = (
    "exchange",
    "routing_key",
    "queue",
    "dead_letter_exchange",
    "dlq",
    "retry_exchange",
    "wait_queue",
    "wait_queues",
    "audit_queue",
    "shard_queue",
    "shards",
)
"""The roles an ``"amqp_lab"`` section may name (the first five are required)."""
_SECTION = '"amqp_lab" section'
_PREDEFINED = "amq."  # the broker's own exchanges (amq.direct, amq.topic...), always there


@functools.cache
def schema() -> dict[str, Any]:
    """The schema as a dict (read once)."""
    data: dict[str, Any] = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return data


@functools.cache
def _validator() -> Draft202012Validator:
    Draft202012Validator.check_schema(schema())
    return Draft202012Validator(schema())


def check_definitions(data: Any) -> None:
    """Refuse ``data`` (a parsed definitions file) unless it matches the schema and every
    binding joins objects it declares. Raises TopologyError with one line naming the first
    problem (the shallowest, then in file order)."""
    errors = sorted(_validator().iter_errors(data), key=_order)
    if errors:
        raise TopologyError(_describe(errors[0], data))
    _check_bindings(data)
    _check_queue_types(data)


def binding_label(binding: dict[str, Any]) -> str:
    """``source -> destination (routing key 'rk')``: how every message names a binding."""
    source, destination = binding.get("source"), binding.get("destination")
    key = binding.get("routing_key", "")
    return one_line(f"{_short(source)} -> {_short(destination)} (routing key {_short(key)})")


def _order(error: ValidationError) -> tuple[int, list[str]]:
    path = list(error.absolute_path)
    return len(path), [f"{p:08d}" if isinstance(p, int) else str(p) for p in path]


def _short(value: Any, limit: int = 60) -> str:
    """A value as it may appear in an error line: its repr (a str bare), escaped, cut."""
    text = value if isinstance(value, str) else repr(value)
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _value(value: Any) -> str:
    """A value of the file quoted as in Python (a string in quotes), escaped, cut."""
    return _short(repr(value))


def _where(path: Sequence[Any], data: Any) -> str:
    """``queues[3] ('q:tasks:wait:1').durable``: a field, with the object it belongs to."""
    parts: list[str] = []
    node = data
    for step in path:
        node = node[step] if isinstance(node, dict | list) else None
        if isinstance(step, int):
            label = ""
            if parts and parts[-1] == "bindings" and isinstance(node, dict):
                label = f" ({binding_label(node)})"
            elif isinstance(node, dict) and isinstance(node.get("name"), str):
                label = f" ({_short(node['name'])!r})"
            parts[-1] += f"[{step}]{label}"
        else:
            parts.append(one_line(str(step)))
    return ".".join(parts)


def _describe(error: ValidationError, data: Any) -> str:
    """One line for one schema error, naming the field (see the module docstring)."""
    path = list(error.absolute_path)
    where = _where(path, data)
    kind = error.validator
    instance: Any = error.instance
    expected: Any = error.validator_value  # typed "Any | Unset" by the stubs
    schema_here: Any = error.schema
    if kind == "required":
        missing = [k for k in expected if k not in instance]
        if not path:
            return (
                f"no {_SECTION}: it names the roles ({', '.join(ROLES[:5])}...) that every "
                "command takes its queue and exchange names from (docs/topology.md)"
            )
        if path == ["amqp_lab"]:
            return f"the {_SECTION} does not name {', '.join(missing)}"
        return f"{where}: missing {', '.join(missing)}"
    if kind == "additionalProperties":
        known = schema_here.get("properties", {})
        extra = [k for k in instance if k not in known]
        if path == ["amqp_lab"]:
            return (
                f"the {_SECTION} names an unknown role {_short(extra[0])!r} (the roles: "
                f"{', '.join(ROLES)})"
            )
        return f"{where}: unknown field {_short(extra[0])!r} (the fields: {', '.join(known)})"
    where = where or "the file"
    if kind == "type":
        return f"{where}: {_value(instance)} is not of type {expected!r}"
    if kind == "enum":
        choices = ", ".join(repr(v) for v in expected)
        return f"{where}: {_value(instance)} is not one of {choices}"
    if kind == "pattern" and path[-1:] in (["wait_queue"], ["shard_queue"]):
        return f"{where}: {_value(instance)} is not a queue name template with {{n}}"
    if kind == "minLength":
        return f"{where}: must not be empty"
    if kind == "maxLength":
        return f"{where}: longer than {expected} characters"
    if kind == "minProperties":
        return f"{where}: must not be empty (RabbitMQ refuses an empty policy definition)"
    return f"{where}: {_short(error.message, 200)}"


def _check_bindings(data: dict[str, Any]) -> None:
    """Every binding's source is an exchange of the file (or one of the broker's ``amq.*``
    exchanges), its destination a queue or exchange of the file."""
    exchanges = {e["name"] for e in data.get("exchanges", [])}
    queues = {q["name"] for q in data.get("queues", [])}
    for binding in data.get("bindings", []):
        source, destination = binding["source"], binding["destination"]
        kind = binding.get("destination_type", "queue")
        if source not in exchanges and not source.startswith(_PREDEFINED):
            problem = f"its source exchange {_short(source)!r} is not declared in the file"
        elif destination not in (queues if kind == "queue" else exchanges) and not (
            kind == "exchange" and destination.startswith(_PREDEFINED)
        ):
            problem = f"its destination {kind} {_short(destination)!r} is not declared in the file"
        else:
            continue
        raise TopologyError(f"binding {binding_label(binding)}: {problem}")


def _check_queue_types(data: dict[str, Any]) -> None:
    """A queue's ``type`` (RabbitMQ 3.13+ exports have one) says what its ``x-queue-type``
    argument says: amqp-lab declares a queue with its arguments, so a ``type`` alone would be
    ignored and the queue declared classic."""
    for queue in data.get("queues", []):
        declared = queue.get("type")
        argument = (queue.get("arguments") or {}).get("x-queue-type", "classic")
        if declared is not None and declared != argument:
            raise TopologyError(
                f'queue {_short(queue["name"])!r}: "type" is {declared!r} but its '
                f"x-queue-type argument says {_short(argument)!r}: set the argument (a queue's "
                "type is a declare argument)"
            )
