"""Topology as data: load definitions JSON, value objects, expected policy per queue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.errors import TopologyError
from amqp_lab.topology import (
    DEFAULT_TOPOLOGY,
    Binding,
    Exchange,
    Policy,
    Queue,
    Topology,
    load_topology,
    topology_from_definitions,
)
from amqp_lab.topology.model import expected_policy_per_queue

pytestmark = pytest.mark.unit

DEFINITIONS = (
    Path(__file__).resolve().parents[2] / "amqp_lab" / "topology" / "data" / "definitions.json"
)

DLX_POLICY = Policy(
    "q-tasks-dlx",
    "^q:tasks$",
    (("dead-letter-exchange", "tasks.dlx"), ("queue-mode", "lazy")),
    10,
)
AUDIT_POLICY = Policy(
    "q-tasks-audit-limit",
    "^q:tasks:audit$",
    (("max-length", 100000), ("overflow", "drop-head"), ("queue-mode", "lazy")),
    10,
)
DLQ_POLICY = Policy("q-tasks-dlq", "^q:tasks:dlq$", (("queue-mode", "lazy"),), 10)
WAIT_POLICY = Policy(
    "q-tasks-wait",
    r"^q:tasks:wait:\d+$",
    (("dead-letter-exchange", "tasks.retry"), ("message-ttl", 300000)),
    10,
)


@pytest.fixture(scope="module")
def lab_topology() -> Topology:
    return load_topology(DEFINITIONS)


def _with_section(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with a minimal valid "amqp_lab" section and the objects it names, so that
    load_topology's schema check passes and a test reaches the problem it is about."""
    return {
        "amqp_lab": {
            "exchange": "x",
            "routing_key": "k",
            "queue": "q:x",
            "dead_letter_exchange": "x.dlx",
            "dlq": "q:x:dlq",
        },
        "exchanges": [{"name": "x"}, {"name": "x.dlx", "type": "fanout"}],
        "queues": [{"name": "q:x"}, {"name": "q:x:dlq"}, *data.get("queues", [])],
    }


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps(data))
    return path


# --- the lab's definitions.json --------------------------------------------------------------
def test_default_topology_is_the_repository_file() -> None:
    assert DEFAULT_TOPOLOGY == DEFINITIONS


def test_tasks_exchange_is_direct_and_durable(lab_topology: Topology) -> None:
    tasks = next(e for e in lab_topology.exchanges if e.name == "tasks")
    assert tasks == Exchange("tasks", "direct", durable=True, auto_delete=False, internal=False)


def test_exchanges(lab_topology: Topology) -> None:
    assert lab_topology.exchanges == (
        Exchange("tasks", "direct"),
        Exchange("tasks.dlx", "fanout"),
        Exchange("tasks.retry", "fanout"),
    )


@pytest.mark.parametrize("name", ["q:tasks", "q:tasks:audit", "q:tasks:dlq"])
def test_queue_is_durable_without_arguments(lab_topology: Topology, name: str) -> None:
    assert lab_topology.queue(name) == Queue(name, durable=True, auto_delete=False, arguments=())


def test_queue_names(lab_topology: Topology) -> None:
    assert [q.name for q in lab_topology.queues] == [
        "q:tasks",
        "q:tasks:audit",
        "q:tasks:dlq",
        *[f"q:tasks:wait:{n}" for n in range(1, 10)],
    ]


def test_no_queue_sets_dead_lettering_by_argument(lab_topology: Topology) -> None:
    assert [k for q in lab_topology.queues for k, _ in q.arguments if k.startswith("x-dead")] == []


def test_bindings(lab_topology: Topology) -> None:
    assert lab_topology.bindings == (
        Binding("tasks", "q:tasks", "task"),
        Binding("tasks", "q:tasks:audit", "task"),
        Binding("tasks.dlx", "q:tasks:dlq", ""),
        Binding("tasks.retry", "q:tasks", ""),
    )


def test_dead_letter_policy(lab_topology: Topology) -> None:
    policy = next(p for p in lab_topology.policies if p.pattern == "^q:tasks$")
    assert policy == DLX_POLICY
    assert policy.definition_dict == {"dead-letter-exchange": "tasks.dlx", "queue-mode": "lazy"}


def test_policies(lab_topology: Topology) -> None:
    assert lab_topology.policies == (DLX_POLICY, AUDIT_POLICY, DLQ_POLICY, WAIT_POLICY)


def test_long_lived_queues_are_lazy_and_wait_queues_are_not(lab_topology: Topology) -> None:
    lazy = {
        p.pattern for p in lab_topology.policies if p.definition_dict.get("queue-mode") == "lazy"
    }
    assert lazy == {"^q:tasks$", "^q:tasks:audit$", "^q:tasks:dlq$"}


def test_wait_policy_returns_expired_messages_to_q_tasks(lab_topology: Topology) -> None:
    assert WAIT_POLICY.definition_dict == {
        "dead-letter-exchange": "tasks.retry",
        "message-ttl": 300_000,
    }


def test_unknown_queue_raises_topology_error(lab_topology: Topology) -> None:
    with pytest.raises(TopologyError, match=r"^topology has no queue 'q:nope'$"):
        lab_topology.queue("q:nope")


def test_load_topology_defaults_to_the_repository_file(lab_topology: Topology) -> None:
    assert load_topology() == lab_topology


# --- topology_from_definitions -----------------------------------------------------------------
@pytest.mark.parametrize("argument", ["x-dead-letter-exchange", "x-dead-letter-routing-key"])
def test_dead_letter_queue_arguments_are_rejected(argument: str) -> None:
    data = {"queues": [{"name": "q:orders", "arguments": {argument: "orders.dlx"}}]}
    with pytest.raises(
        TopologyError,
        match=rf"^queue 'q:orders' sets \['{argument}'\] as a queue argument: set dead-lettering "
        "with a policy instead$",
    ):
        topology_from_definitions(data)


def test_load_topology_rejects_a_file_with_dead_letter_arguments(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        _with_section(
            {"queues": [{"name": "q:a", "arguments": {"x-dead-letter-exchange": "dlx"}}]}
        ),
    )
    with pytest.raises(TopologyError, match=r"^queue 'q:a' sets \['x-dead-letter-exchange'\]"):
        load_topology(path)


def test_other_queue_arguments_are_kept_sorted() -> None:
    data = {"queues": [{"name": "q:a", "arguments": {"x-queue-type": "quorum", "x-max-length": 5}}]}
    assert topology_from_definitions(data).queues == (
        Queue("q:a", arguments=(("x-max-length", 5), ("x-queue-type", "quorum"))),
    )


def test_defaults_for_missing_fields() -> None:
    data = {
        "exchanges": [{"name": "x"}],
        "queues": [{"name": "q"}],
        "bindings": [{"source": "x", "destination": "q"}],
        "policies": [{"name": "p", "pattern": "^q$", "definition": {"max-length": 1}}],
    }
    assert topology_from_definitions(data) == Topology(
        exchanges=(Exchange("x", "direct", True, False, False, ()),),
        queues=(Queue("q", True, False, ()),),
        bindings=(Binding("x", "q", "", "queue", ()),),
        policies=(Policy("p", "^q$", (("max-length", 1),), 0, "queues"),),
    )


def test_vhost_fields_are_ignored() -> None:
    with_vhost = {"queues": [{"name": "q", "vhost": "/"}], "vhosts": [{"name": "/"}]}
    assert topology_from_definitions(with_vhost) == topology_from_definitions(
        {"queues": [{"name": "q"}]}
    )


def test_empty_definitions_give_an_empty_topology() -> None:
    assert topology_from_definitions({}) == Topology()


# --- value objects -----------------------------------------------------------------------------
def test_topology_is_hashable_and_equal_for_equal_data(lab_topology: Topology) -> None:
    again = load_topology(DEFINITIONS)
    assert again == lab_topology
    assert hash(again) == hash(lab_topology)
    assert len({again, lab_topology}) == 1


def test_argument_order_does_not_matter() -> None:
    first = topology_from_definitions({"queues": [{"name": "q", "arguments": {"a": 1, "b": 2}}]})
    second = topology_from_definitions({"queues": [{"name": "q", "arguments": {"b": 2, "a": 1}}]})
    assert (first == second, hash(first) == hash(second)) == (True, True)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (Exchange("tasks"), Exchange("tasks", "direct", True, False, False, ())),
        (Queue("q"), Queue("q", True, False, ())),
        (Binding("x", "q"), Binding("x", "q", "", "queue", ())),
        (Policy("p", "^q$", (("k", 1),)), Policy("p", "^q$", (("k", 1),), 0, "queues")),
    ],
    ids=["exchange", "queue", "binding", "policy"],
)
def test_value_objects_are_equal_and_hash_equal(left: object, right: object) -> None:
    assert left == right
    assert hash(left) == hash(right)


def test_different_data_gives_unequal_objects() -> None:
    assert Queue("q", durable=True) != Queue("q", durable=False)


# --- load_topology errors -------------------------------------------------------------------------
def test_missing_file_raises_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "missing.json"
    with pytest.raises(TopologyError, match=rf"^cannot load topology {path}: FileNotFoundError: "):
        load_topology(path)


def test_bad_json_raises_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"queues": [')
    with pytest.raises(TopologyError, match=rf"^cannot load topology {path}: JSONDecodeError: "):
        load_topology(path)


def test_missing_key_raises_topology_error(tmp_path: Path) -> None:
    # issue 23: the schema names the field (it used to be "KeyError: 'name'")
    path = _write(tmp_path, _with_section({"queues": [{"durable": True}]}))
    with pytest.raises(
        TopologyError, match=rf"^cannot load topology {path}: queues\[2\]: missing name$"
    ):
        load_topology(path)


def test_wrong_shape_raises_topology_error(tmp_path: Path) -> None:
    # issue 23: the schema names the field (it used to be "TypeError: ...")
    path = _write(tmp_path, _with_section({"queues": ["q:tasks"]}))
    with pytest.raises(
        TopologyError,
        match=rf"^cannot load topology {path}: queues\[2\]: 'q:tasks' is not of type 'object'$",
    ):
        load_topology(path)


@pytest.mark.parametrize(
    "data",
    [[], {"queues": [{"name": "q", "arguments": ["x-max-length"]}]}],
    ids=["top-level-list", "arguments-list"],
)
def test_list_where_an_object_belongs_raises_topology_error(tmp_path: Path, data: Any) -> None:
    with pytest.raises(TopologyError):
        load_topology(_write(tmp_path, data))


# --- expected_policy_per_queue ------------------------------------------------------------------
def test_expected_policies_of_the_lab_topology(lab_topology: Topology) -> None:
    assert expected_policy_per_queue(lab_topology) == {
        "q:tasks": DLX_POLICY,
        "q:tasks:audit": AUDIT_POLICY,
        "q:tasks:dlq": DLQ_POLICY,
        **{f"q:tasks:wait:{n}": WAIT_POLICY for n in range(1, 10)},
    }


def test_highest_priority_policy_wins() -> None:
    low = Policy("low", "^q:", (("max-length", 1),), priority=1)
    high = Policy("high", "^q:a$", (("max-length", 2),), priority=5)
    topology = Topology(queues=(Queue("q:a"), Queue("q:b")), policies=(low, high))
    assert expected_policy_per_queue(topology) == {"q:a": high, "q:b": low}


def test_pattern_is_unanchored_search() -> None:
    policy = Policy("p", "tasks", (("max-length", 1),))
    topology = Topology(queues=(Queue("q:tasks:dlq"),), policies=(policy,))
    assert expected_policy_per_queue(topology) == {"q:tasks:dlq": policy}


@pytest.mark.parametrize(
    ("apply_to", "applies"), [("queues", True), ("all", True), ("exchanges", False)]
)
def test_policy_apply_to(apply_to: str, applies: bool) -> None:
    policy = Policy("p", "^q$", (("max-length", 1),), apply_to=apply_to)
    topology = Topology(queues=(Queue("q"),), policies=(policy,))
    assert expected_policy_per_queue(topology) == ({"q": policy} if applies else {})


def test_queue_without_matching_policy_has_none() -> None:
    policy = Policy("p", "^other$", (("max-length", 1),))
    topology = Topology(queues=(Queue("q"),), policies=(policy,))
    assert expected_policy_per_queue(topology) == {}
