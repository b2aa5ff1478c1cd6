"""Every refusal of the topology schema (amqp_lab/topology/schema.json, checked by
load_topology and so by every command): one line naming the field, a bad binding named by
source, destination and routing key; every file amqp-lab ships passes."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from amqp_lab.errors import TopologyError
from amqp_lab.topology import load_topology
from amqp_lab.topology.load import DATA
from amqp_lab.topology.schema import ROLES, SCHEMA, check_definitions, schema

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
VALID: dict[str, Any] = {
    "_comment": "a small valid topology",
    "amqp_lab": {
        "exchange": "x",
        "routing_key": "k",
        "queue": "q:x",
        "dead_letter_exchange": "x.dlx",
        "dlq": "q:x:dlq",
        "retry_exchange": "x.retry",
        "wait_queue": "q:x:wait:{n}",
        "wait_queues": 1,
    },
    "exchanges": [
        {"name": "x", "type": "direct", "durable": True},
        {"name": "x.dlx", "type": "fanout"},
        {"name": "x.retry", "type": "fanout"},
    ],
    "queues": [{"name": "q:x"}, {"name": "q:x:dlq"}, {"name": "q:x:wait:1", "vhost": "/"}],
    "bindings": [
        {"source": "x", "destination": "q:x", "destination_type": "queue", "routing_key": "k"},
        {"source": "x.dlx", "destination": "q:x:dlq"},
        {"source": "x.retry", "destination": "q:x"},
    ],
    "policies": [
        {"name": "p", "pattern": "^q:x$", "apply-to": "queues", "definition": {"max-length": 5}}
    ],
    "rabbit_version": "4.3.6",  # other keys of a definitions export are allowed and ignored
}


def changed(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    change(data)
    return data


def refusal(data: Any) -> str:
    with pytest.raises(TopologyError) as raised:
        check_definitions(data)
    text = str(raised.value)
    assert "\n" not in text and len(text) < 400, text
    return text


def test_the_schema_is_valid_and_package_data() -> None:
    Draft202012Validator.check_schema(schema())
    assert SCHEMA.parent == (ROOT / "amqp_lab" / "topology") and SCHEMA.is_file()
    package_data = (ROOT / "pyproject.toml").read_text()
    assert '"amqp_lab.topology" = ["*.json", "data/*.json"]' in package_data
    assert set(schema()["$defs"]["roles"]["properties"]) - {"_comment"} == set(ROLES)


def test_a_valid_file_passes_and_loads(tmp_path: Path) -> None:
    check_definitions(VALID)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(VALID))
    assert load_topology(path).names.wait_queue(1) == "q:x:wait:1"


@pytest.mark.parametrize("path", sorted((ROOT / "topology").glob("*.json")), ids=lambda p: p.name)
def test_every_file_amqp_lab_ships_passes(path: Path) -> None:
    check_definitions(json.loads(path.read_text()))
    check_definitions(json.loads((DATA / path.name).read_text()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.pop("amqp_lab"),
            'no "amqp_lab" section: it names the roles (exchange, routing_key, queue, '
            "dead_letter_exchange, dlq...) that every command takes its queue and exchange "
            "names from (docs/topology.md)",
        ),
        (
            lambda d: d.update(amqp_lab=["x"]),
            "amqp_lab: ['x'] is not of type 'object'",
        ),
        (
            lambda d: d["amqp_lab"].pop("dlq"),
            'the "amqp_lab" section does not name dlq',
        ),
        (
            lambda d: d["amqp_lab"].update(dead_letter_queue="q:x:dlq"),
            "the \"amqp_lab\" section names an unknown role 'dead_letter_queue' (the roles: "
            + ", ".join(ROLES)
            + ")",
        ),
        (
            lambda d: d["amqp_lab"].update(wait_queues="9"),
            "amqp_lab.wait_queues: '9' is not of type 'integer'",
        ),
        (
            lambda d: d["amqp_lab"].update(wait_queues=True),
            "amqp_lab.wait_queues: True is not of type 'integer'",
        ),
        (
            lambda d: d["amqp_lab"].update(wait_queues=-1),
            "amqp_lab.wait_queues: -1 is less than the minimum of 0",
        ),
        (
            lambda d: d["amqp_lab"].update(queue=7),
            "amqp_lab.queue: 7 is not of type 'string'",
        ),
        (
            lambda d: d["amqp_lab"].update(queue=""),
            "amqp_lab.queue: must not be empty",
        ),
        (
            lambda d: d["amqp_lab"].update(wait_queue="q:x:wait"),
            "amqp_lab.wait_queue: 'q:x:wait' is not a queue name template with {n}",
        ),
        (
            lambda d: d["amqp_lab"].update(shard_queue="q:x:shard"),
            "amqp_lab.shard_queue: 'q:x:shard' is not a queue name template with {n}",
        ),
        (
            lambda d: d["queues"][1].update(durable="yes"),
            "queues[1] ('q:x:dlq').durable: 'yes' is not of type 'boolean'",
        ),
        (
            lambda d: d["queues"][0].update(arguments=["x-max-length"]),
            "queues[0] ('q:x').arguments: ['x-max-length'] is not of type 'object'",
        ),
        (
            lambda d: d["queues"][0].update(durabel=False),
            "queues[0] ('q:x'): unknown field 'durabel' (the fields: name, vhost, type, "
            "durable, auto_delete, arguments)",
        ),
        (
            lambda d: d["queues"][0].update(type="lazy"),
            "queues[0] ('q:x').type: 'lazy' is not one of 'classic', 'quorum', 'stream'",
        ),
        (
            lambda d: d["queues"].append({"durable": True}),
            "queues[3]: missing name",
        ),
        (
            lambda d: d["queues"].append("q:y"),
            "queues[3]: 'q:y' is not of type 'object'",
        ),
        (
            lambda d: d["queues"].append({"name": "q" * 300}),
            "queues[3] ('" + "q" * 57 + "...').name: longer than 255 characters",
        ),
        (
            lambda d: d.update(queues={"q:x": {}}),
            "queues: {'q:x': {}} is not of type 'array'",
        ),
        (
            lambda d: d["exchanges"][0].update(internal="no"),
            "exchanges[0] ('x').internal: 'no' is not of type 'boolean'",
        ),
        (
            lambda d: d["exchanges"][1].update(type=""),
            "exchanges[1] ('x.dlx').type: must not be empty",
        ),
        (
            lambda d: d["policies"][0].update({"apply-to": "queue"}),
            "policies[0] ('p').apply-to: 'queue' is not one of 'queues', 'exchanges', 'all', "
            "'classic_queues', 'quorum_queues', 'streams'",
        ),
        (
            lambda d: d["policies"][0].update(priority="10"),
            "policies[0] ('p').priority: '10' is not of type 'integer'",
        ),
        (
            lambda d: d["policies"][0].update(definition={}),
            "policies[0] ('p').definition: must not be empty (RabbitMQ refuses an empty policy "
            "definition)",
        ),
        (
            lambda d: d["policies"][0].pop("pattern"),
            "policies[0] ('p'): missing pattern",
        ),
        (
            lambda d: d["bindings"][0].update(destination_type="topic"),
            "bindings[0] (x -> q:x (routing key k)).destination_type: 'topic' is not one of "
            "'queue', 'exchange'",
        ),
        (
            lambda d: d["bindings"][0].update(routing_key=5),
            "bindings[0] (x -> q:x (routing key 5)).routing_key: 5 is not of type 'string'",
        ),
        (
            lambda d: d["bindings"][1].pop("destination"),
            "bindings[1] (x.dlx -> None (routing key )): missing destination",
        ),
        (
            lambda d: d["bindings"][2].update(source=""),
            "bindings[2] ( -> q:x (routing key )).source: must not be empty",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_refusal_is_one_line_naming_the_field(
    change: Callable[[dict[str, Any]], object], message: str
) -> None:
    assert refusal(changed(change)) == message


def test_a_file_that_is_not_an_object_is_refused() -> None:
    assert refusal([]) == "the file: [] is not of type 'object'"


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (
            {"source": "x", "destination": "q:nope", "routing_key": "k"},
            "binding x -> q:nope (routing key k): its destination queue 'q:nope' is not "
            "declared in the file",
        ),
        (
            {"source": "nope", "destination": "q:x", "routing_key": "k"},
            "binding nope -> q:x (routing key k): its source exchange 'nope' is not declared "
            "in the file",
        ),
        (
            {"source": "x", "destination": "q:x", "destination_type": "exchange"},
            "binding x -> q:x (routing key ): its destination exchange 'q:x' is not declared in "
            "the file",
        ),
    ],
)
def test_a_binding_to_an_undeclared_object_is_refused_naming_the_binding(
    binding: dict[str, Any], message: str
) -> None:
    assert refusal(changed(lambda d: d["bindings"].append(binding))) == message


def test_the_brokers_own_exchanges_may_be_bound() -> None:
    check_definitions(
        changed(lambda d: d["bindings"].append({"source": "amq.topic", "destination": "q:x"}))
    )


def test_a_queue_type_that_its_arguments_contradict_is_refused() -> None:
    assert refusal(changed(lambda d: d["queues"][0].update(type="quorum"))) == (
        "queue 'q:x': \"type\" is 'quorum' but its x-queue-type argument says 'classic': set "
        "the argument (a queue's type is a declare argument)"
    )
    agreeing = {"type": "quorum", "arguments": {"x-queue-type": "quorum"}}
    check_definitions(changed(lambda d: d["queues"][0].update(agreeing)))


def test_a_hostile_value_is_quoted_short_and_on_one_line() -> None:
    hostile = "evil\n\x1b[2Jerror: forged line " + "x" * 10_000
    text = refusal(changed(lambda d: d["queues"][0].update(durable=hostile)))
    assert text.startswith("queues[0] ('q:x').durable: 'evil\\n\\x1b[2Jerror: forged line xx")
    assert len(text) < 200 and "\x1b" not in text


def test_load_topology_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(changed(lambda d: d["queues"][1].update(durable="yes"))))
    with pytest.raises(TopologyError) as raised:
        load_topology(path)
    assert str(raised.value) == (
        f"cannot load topology {path}: queues[1] ('q:x:dlq').durable: 'yes' is not of type "
        "'boolean'"
    )


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {k: v for k, v in VALID.items() if k != "amqp_lab"},
            'no "amqp_lab" section: it names the roles',
        ),
        (changed(lambda d: d["amqp_lab"].update(dlqueue="q")), "names an unknown role 'dlqueue'"),
        (changed(lambda d: d["queues"][0].update(durable=1)), "('q:x').durable: 1 is not of"),
    ],
    ids=["no-section", "unknown-role", "wrong-type"],
)
def test_the_topology_command_refuses_a_bad_file_in_one_line(
    tmp_path: Path, data: dict[str, Any], line: str
) -> None:
    """amqp-lab-topology (scripts/setup_topology.py) reads the file before it needs a broker:
    the refusal is one ``error:`` line, exit 1, nothing applied."""
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "setup_topology.py"), "--topology", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "EAI_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/x"},
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: cannot load topology {path}: ")
    assert result.stderr.count("\n") == 1 and line in result.stderr
