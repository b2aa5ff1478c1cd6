"""The quorum variant of a topology (pure): every row of what with_queue_type changes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from amqp_lab.errors import TopologyError
from amqp_lab.topology import (
    DEFAULT_DELIVERY_LIMIT,
    Policy,
    Queue,
    Topology,
    for_broker,
    load_topology,
    queue_type_of,
    with_queue_type,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def lab() -> Topology:
    return load_topology()


def test_classic_is_the_data_unchanged(lab: Topology) -> None:
    assert with_queue_type(lab, "classic") is lab
    assert queue_type_of(lab) == "classic"


def test_every_queue_is_declared_quorum_and_names_are_kept(lab: Topology) -> None:
    quorum = with_queue_type(lab, "quorum")
    assert [q.name for q in quorum.queues] == [q.name for q in lab.queues]
    assert {dict(q.arguments)["x-queue-type"] for q in quorum.queues} == {"quorum"}
    assert quorum.names == lab.names
    assert (quorum.exchanges, quorum.bindings) == (lab.exchanges, lab.bindings)
    assert queue_type_of(quorum) == "quorum"


def test_policies_of_the_quorum_variant(lab: Topology) -> None:
    policies = {p.name: p.definition_dict for p in with_queue_type(lab, "quorum").policies}
    assert policies == {
        "q-tasks-dlx": {
            "dead-letter-exchange": "tasks.dlx",
            "dead-letter-strategy": "at-least-once",
            "overflow": "reject-publish",
            "delivery-limit": DEFAULT_DELIVERY_LIMIT,
        },
        "q-tasks-audit-limit": {
            "max-length": 100000,
            "overflow": "drop-head",
            "delivery-limit": -1,
        },
        "q-tasks-dlq": {"delivery-limit": -1},
        "q-tasks-wait": {
            "dead-letter-exchange": "tasks.retry",
            "message-ttl": 300000,
            "dead-letter-strategy": "at-least-once",
            "overflow": "reject-publish",
            "delivery-limit": DEFAULT_DELIVERY_LIMIT,
        },
    }


def test_every_queue_keeps_its_policy_and_a_dlq_never_drops(lab: Topology) -> None:
    quorum = with_queue_type(lab, "quorum")
    for queue in quorum.queues:
        policy = quorum.policy_for(queue.name)
        assert policy is not None, queue.name
        definition = policy.definition_dict
        # a quorum queue without a DLX drops what passes its delivery limit: no limit there
        assert "dead-letter-exchange" in definition or definition["delivery-limit"] == -1


def test_converting_twice_is_a_no_op(lab: Topology) -> None:
    once = with_queue_type(lab, "quorum")
    assert with_queue_type(once, "quorum") == once


def test_delivery_limit_is_configurable_and_a_policy_limit_wins(lab: Topology) -> None:
    quorum = with_queue_type(lab, "quorum", delivery_limit=4)
    assert quorum.policy_for("q:tasks") is not None
    assert quorum.policy_for("q:tasks").definition_dict["delivery-limit"] == 4  # type: ignore[union-attr]
    own = Policy("own", "^q:tasks$", (("dead-letter-exchange", "x"), ("delivery-limit", 7)), 10)
    converted = with_queue_type(replace(lab, policies=(own,)), "quorum")
    assert converted.policies[0].definition_dict["delivery-limit"] == 7
    with pytest.raises(TopologyError, match=">= 1"):
        with_queue_type(lab, "quorum", delivery_limit=0)


@pytest.mark.parametrize(
    ("queue", "problem"),
    [
        pytest.param(Queue("q", durable=False), "durable", id="transient"),
        pytest.param(Queue("q", auto_delete=True), "auto-delete", id="auto-delete"),
        pytest.param(
            Queue("q", arguments=(("x-queue-type", "classic"),)), "classic", id="declared-classic"
        ),
    ],
)
def test_a_queue_that_cannot_be_quorum_is_refused(queue: Queue, problem: str) -> None:
    with pytest.raises(TopologyError, match=problem):
        with_queue_type(Topology(queues=(queue,)), "quorum")


def test_a_dlx_with_drop_head_is_refused() -> None:
    policy = Policy("p", ".*", (("dead-letter-exchange", "dlx"), ("overflow", "drop-head")))
    with pytest.raises(TopologyError, match="reject-publish"):
        with_queue_type(Topology(policies=(policy,)), "quorum")


def test_an_unknown_queue_type_is_refused(lab: Topology) -> None:
    with pytest.raises(TopologyError, match="classic or quorum"):
        with_queue_type(lab, "stream")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "dlq_policy"),
    [
        pytest.param("3.10.8", None, id="3.10-no-default-limit-and-refuses-minus-one"),
        pytest.param("3.13.7", None, id="3.13"),
        pytest.param("4.0.5", {"delivery-limit": -1}, id="4.0-default-20-minus-one-disables"),
        pytest.param("4.3.6", {"delivery-limit": -1}, id="4.3"),
        pytest.param("unreadable", {"delivery-limit": -1}, id="unknown-is-recent"),
    ],
)
def test_for_broker_leaves_out_what_an_older_broker_refuses(
    lab: Topology, version: str, dlq_policy: dict[str, int] | None
) -> None:
    adapted = for_broker(with_queue_type(lab, "quorum"), version)
    policies = {p.name: p.definition_dict for p in adapted.policies}
    assert policies.get("q-tasks-dlq") == dlq_policy  # None: no policy left
    assert policies["q-tasks-dlx"]["delivery-limit"] == DEFAULT_DELIVERY_LIMIT  # a real limit stays
    assert for_broker(lab, version) == lab  # the classic data needs nothing
