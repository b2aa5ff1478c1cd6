"""The stream variant of the audit queue (pure): arguments, the retention policy, and how it
composes with the quorum variant."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from amqp_lab.cli.common import add_audit_option, add_queue_type_option, topology_from
from amqp_lab.errors import TopologyError
from amqp_lab.topology import (
    DEFAULT_TOPOLOGY,
    Policy,
    Topology,
    for_broker,
    is_stream,
    load_topology,
    queue_type_of,
    with_queue_type,
    with_stream_audit,
)

pytestmark = pytest.mark.unit
AUDIT = "q:tasks:audit"


@pytest.fixture
def lab() -> Topology:
    return load_topology()


def test_the_audit_queue_is_declared_a_stream_with_its_segment_size(lab: Topology) -> None:
    stream = with_stream_audit(lab, max_length_bytes=20000, max_segment_size_bytes=5000)
    assert dict(stream.queue(AUDIT).arguments) == {
        "x-queue-type": "stream",
        "x-stream-max-segment-size-bytes": 5000,
    }
    others = [q for q in stream.queues if q.name != AUDIT]
    assert others == [q for q in lab.queues if q.name != AUDIT]
    assert (stream.exchanges, stream.bindings, stream.names) == (
        lab.exchanges,
        lab.bindings,
        lab.names,
    )


def test_retention_is_set_by_policy_and_keys_streams_refuse_are_dropped(lab: Topology) -> None:
    assert lab.policy_for(AUDIT) is not None
    assert "overflow" in lab.policy_for(AUDIT).definition_dict  # type: ignore[union-attr]
    stream = with_stream_audit(lab, max_length_bytes=20000, max_age="12h")
    policy = stream.policy_for(AUDIT)
    assert policy is not None and policy.name == "q-tasks-audit-limit"
    assert policy.definition_dict == {"max-length-bytes": 20000, "max-age": "12h"}
    assert with_stream_audit(lab, max_age=None).policy_for(AUDIT).definition_dict == {  # type: ignore[union-attr]
        "max-length-bytes": 1_000_000_000
    }
    assert [p for p in stream.policies if p.name != policy.name] == [
        p for p in lab.policies if p.name != policy.name
    ]


def test_a_policy_shared_with_other_queues_is_left_to_them(lab: Topology) -> None:
    shared = Policy("all-lazy", "^q:tasks", (("queue-mode", "lazy"),), 10)
    data = replace(lab, policies=(shared,))
    stream = with_stream_audit(data, max_length_bytes=1000)
    assert stream.policy_for("q:tasks") == shared
    own = stream.policy_for(AUDIT)
    assert own is not None and own.priority == 11 and own.pattern == "^q:tasks:audit$"
    assert own.definition_dict == {"max-length-bytes": 1000, "max-age": "7D"}


@pytest.mark.parametrize("order", ["quorum-then-stream", "stream-then-quorum"])
def test_it_composes_with_quorum_in_either_order(lab: Topology, order: str) -> None:
    if order == "quorum-then-stream":
        both = with_stream_audit(with_queue_type(lab, "quorum"), max_length_bytes=20000)
    else:
        both = with_queue_type(with_stream_audit(lab, max_length_bytes=20000), "quorum")
    types = {q.name: dict(q.arguments)["x-queue-type"] for q in both.queues}
    assert types.pop(AUDIT) == "stream" and set(types.values()) == {"quorum"}
    assert queue_type_of(both) == "quorum"
    audit_policy = both.policy_for(AUDIT)
    assert audit_policy is not None
    assert audit_policy.definition_dict == {"max-length-bytes": 20000, "max-age": "7D"}
    assert both.policy_for("q:tasks").definition_dict["dead-letter-strategy"] == "at-least-once"  # type: ignore[union-attr]
    assert for_broker(both, "3.10.8").policy_for(AUDIT) == audit_policy


def test_bad_bounds_and_queues_are_refused(lab: Topology) -> None:
    with pytest.raises(TopologyError, match="duration"):
        with_stream_audit(lab, max_age="7 days")
    with pytest.raises(TopologyError, match="max_length_bytes"):
        with_stream_audit(lab, max_length_bytes=0)
    transient = replace(
        lab,
        queues=tuple(replace(q, durable=False) if q.name == AUDIT else q for q in lab.queues),
    )
    with pytest.raises(TopologyError, match="durable"):
        with_stream_audit(transient)
    with pytest.raises(TopologyError, match="audit_queue"):
        with_stream_audit(replace(lab, named=replace(lab.names, audit_queue=None)))


def test_the_command_line_options_build_the_variant() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topology", default=str(DEFAULT_TOPOLOGY))
    add_queue_type_option(parser)
    add_audit_option(parser)
    audit = ["--audit", "stream", "--audit-max-bytes", "5000", "--audit-max-age", "none"]
    args = parser.parse_args([*audit, "--queue-type", "quorum"])
    topology = topology_from(args)
    assert is_stream(topology.queue(AUDIT))
    assert topology.policy_for(AUDIT).definition_dict == {"max-length-bytes": 5000}  # type: ignore[union-attr]
    assert not is_stream(topology_from(parser.parse_args([])).queue(AUDIT))
