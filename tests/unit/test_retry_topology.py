"""The retry-topology check (pure): which effective policies can bring a retry back, and the
retry copy that carries the original destination across hops."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_lab.message import ATTEMPTS_HEADER, JSON
from amqp_lab.retry.broker_held import retry_copy
from amqp_lab.topology.retry_check import RetryExpectations, problems, topic_matches

pytestmark = pytest.mark.unit

EXPECT = RetryExpectations("v", "q:tasks", ("q:tasks:wait:1", "q:tasks:wait:2"), "tasks.retry")
FANOUT = {"name": "tasks.retry", "type": "fanout"}
BOUND = [{"destination": "q:tasks", "destination_type": "queue", "routing_key": ""}]


def queue(
    policy: str | None = "q-tasks-wait", operator: str | None = None, **definition: Any
) -> dict[str, Any]:
    return {
        "arguments": definition.pop("arguments", {}),
        "policy": policy,
        "operator_policy": operator,
        "effective_policy_definition": definition,
    }


def waits(**overrides: dict[str, Any] | None) -> dict[str, dict[str, Any] | None]:
    good = queue(**{"dead-letter-exchange": "tasks.retry", "message-ttl": 300000})  # type: ignore[arg-type]
    result: dict[str, dict[str, Any] | None] = {n: dict(good) for n in EXPECT.wait_queues}
    result.update({k.replace("_", ":"): v for k, v in overrides.items()})
    return result


def test_our_topology_has_no_problem() -> None:
    assert problems(EXPECT, queue("q-tasks-dlx"), waits(), FANOUT, BOUND) == []


def test_a_higher_priority_policy_without_dlx_is_named() -> None:
    replaced = queue("catch-all", **{"max-length": 1000})  # type: ignore[arg-type]
    found = problems(EXPECT, queue(), waits(q_tasks_wait_2=replaced), FANOUT, BOUND)
    assert len(found) == 1
    assert "wait queue 'q:tasks:wait:2' dead-letters to None" in found[0]
    assert "policy 'catch-all'" in found[0]


def test_an_operator_policy_that_expires_the_wait_queue_is_named() -> None:
    expiring = queue(
        "q-tasks-wait", "ops-expire", **{"dead-letter-exchange": "tasks.retry", "expires": 60000}
    )
    (found,) = problems(EXPECT, queue(), waits(q_tasks_wait_1=expiring), FANOUT, BOUND)
    assert "expires after 60000 ms" in found and "operator policy 'ops-expire'" in found


def test_a_queue_argument_wins_over_the_policy() -> None:
    argued = queue(
        **{  # type: ignore[arg-type]
            "dead-letter-exchange": "tasks.retry",
            "arguments": {"x-dead-letter-exchange": "elsewhere"},
        }
    )
    (found,) = problems(EXPECT, queue(), waits(q_tasks_wait_1=argued), FANOUT, BOUND)
    assert "dead-letters to 'elsewhere'" in found


def test_missing_pieces_are_each_named() -> None:
    found = problems(EXPECT, queue(), waits(q_tasks_wait_1=None), None, [])
    assert found == [
        "retry exchange 'tasks.retry' does not exist",
        "wait queue 'q:tasks:wait:1' does not exist",
    ]


def test_a_retry_exchange_not_bound_to_the_work_queue() -> None:
    found = problems(EXPECT, queue(), waits(), FANOUT, [])
    assert found == [
        f"retry exchange 'tasks.retry' does not route routing key '{n}' (from wait queue "
        f"'{n}') to queue 'q:tasks'"
        for n in EXPECT.wait_queues
    ]


def test_a_direct_retry_exchange_routes_by_the_dead_letter_routing_key() -> None:
    direct = {"name": "tasks.retry", "type": "direct"}
    bound = [{"destination": "q:tasks", "destination_type": "queue", "routing_key": "back"}]
    rerouted = queue(**{"dead-letter-exchange": "tasks.retry", "dead-letter-routing-key": "back"})
    ok = waits(q_tasks_wait_1=rerouted, q_tasks_wait_2=rerouted)
    assert problems(EXPECT, queue(), ok, direct, bound) == []
    assert len(problems(EXPECT, queue(), waits(), direct, bound)) == 2


def test_reject_mode_needs_the_dlx_on_the_work_queue() -> None:
    expect = RetryExpectations("v", "q:tasks", (), "tasks.retry", "tasks.dlx")
    assert problems(expect, queue(**{"dead-letter-exchange": "tasks.dlx"}), {}, None, []) == []
    (found,) = problems(expect, queue("other"), {}, None, [])
    assert "dead-letters to None, expected 'tasks.dlx' (policy 'other')" in found


def test_a_missing_work_queue() -> None:
    assert problems(EXPECT, None, waits(), FANOUT, BOUND) == [
        "queue 'q:tasks' does not exist in vhost 'v'"
    ]


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("#", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),
        ("#.c", "a.b.c", True),
        ("*.b.#", "a.b", True),
        ("a", "b", False),
        ("q:tasks:wait:1", "q:tasks:wait:1", True),
    ],
)
def test_topic_matching(pattern: str, key: str, matches: bool) -> None:
    assert topic_matches(pattern, key) is matches


def _copy(headers: dict[str, Any], exchange: str = "tasks", routing_key: str = "task") -> Any:
    return retry_copy(
        body=b"{}",
        message_id="m-1",
        properties={
            "content_type": JSON,
            "correlation_id": "c-1",
            "timestamp": 1700000000,
            "expiration": "5",
        },
        headers=headers,
        exchange=exchange,
        routing_key=routing_key,
        wait_queue="q:tasks:wait:2",
        attempts=2,
        first_seen_at="2026-11-29T17:40:00.000Z",
        wait=1.5,
    )


def test_retry_copy_keeps_the_publishers_headers_and_properties() -> None:
    copy = _copy(
        {"x-request-id": "r-1", "trace": b"\x00", "x-death": [{"count": 1}], ATTEMPTS_HEADER: 1}
    )
    assert (copy.exchange, copy.routing_key, copy.expiration) == ("", "q:tasks:wait:2", "1500")
    assert copy.headers == {
        "x-request-id": "r-1",
        "trace": b"\x00",
        "attempts": 2,
        "first_seen_at": "2026-11-29T17:40:00.000Z",
        "original_exchange": "tasks",
        "original_routing_key": "task",
    }
    assert (copy.correlation_id, copy.timestamp, copy.content_type) == ("c-1", 1700000000, JSON)


def test_retry_copy_keeps_the_original_destination_after_a_hop() -> None:
    back = {"original_exchange": "orders", "original_routing_key": "created", ATTEMPTS_HEADER: 1}
    copy = _copy(back, exchange="tasks.retry", routing_key="q:tasks:wait:1")
    assert (copy.headers["original_exchange"], copy.headers["original_routing_key"]) == (
        "orders",
        "created",
    )
