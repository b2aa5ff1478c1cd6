"""setup_topology.py: idempotent apply, DLX by policy, verify and drift, conflicting redeclare."""

from __future__ import annotations

from typing import Any

import pika
import pytest

from amqp_lab.connection import open_channel
from amqp_lab.errors import NotFound, PreconditionFailed
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, topology_from_definitions
from tests.support import get_all, run_script, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.foundation]


def _definitions(api: ManagementClient, vhost: str) -> dict[str, list[Any]]:
    queues = sorted((q["name"], q["durable"], q["arguments"]) for q in api.queues(vhost))
    bindings = sorted(
        (b["source"], b["destination"], b["routing_key"]) for b in api.bindings(vhost)
    )
    policies = sorted(
        (p["name"], p["pattern"], str(p["definition"]))
        for p in [
            api.policy(vhost, n) for n in ("q-tasks-dlx", "q-tasks-audit-limit", "q-tasks-dlq")
        ]
        if p is not None
    )
    return {"queues": queues, "bindings": bindings, "policies": policies}


def test_second_apply_changes_nothing(vhost: BrokerSettings) -> None:
    first = run_script(vhost, "setup_topology.py")
    assert first.returncode == 0, first.stderr
    data = load_topology()
    total = len(data.exchanges) + len(data.queues) + len(data.bindings) + len(data.policies)
    assert total == 23  # 3 exchanges, 12 queues, 4 bindings, 4 policies
    assert f"{total} created, 0 unchanged" in first.stdout
    with ManagementClient(vhost) as api:
        before = _definitions(api, vhost.vhost)
        second = run_script(vhost, "setup_topology.py")
        after = _definitions(api, vhost.vhost)
    assert second.returncode == 0, second.stderr
    assert f"0 created, {total} unchanged" in second.stdout
    assert "created " not in second.stdout.replace("0 created", "")
    assert before == after
    assert ("tasks", "q:tasks", "task") in after["bindings"]
    assert ("tasks", "q:tasks:audit", "task") in after["bindings"]
    assert ("tasks.dlx", "q:tasks:dlq", "") in after["bindings"]


def test_dlx_comes_from_policy_not_queue_arguments(topology: BrokerSettings) -> None:
    with ManagementClient(topology) as api:
        queue = api.queue(topology.vhost, "q:tasks")
    assert queue is not None
    assert queue["durable"] is True
    with ManagementClient(topology) as api:
        version = api.overview()["rabbitmq_version"]
    if version.startswith("3."):
        assert queue["arguments"] == {}
    else:  # 4.x records the default queue type; still no dead-letter argument
        assert queue["arguments"] == {"x-queue-type": "classic"}
    assert queue["policy"] == "q-tasks-dlx"
    assert queue["effective_policy_definition"]["dead-letter-exchange"] == "tasks.dlx"
    assert queue["effective_policy_definition"]["queue-mode"] == "lazy"


def test_rejected_message_lands_in_dlq_through_the_policy(topology: BrokerSettings) -> None:
    with open_channel(topology) as channel:
        channel.confirm_delivery()
        channel.basic_publish(
            "tasks",
            "task",
            b'{"kind":"ok","seq":1}',
            pika.BasicProperties(message_id="m-1", delivery_mode=2),
            mandatory=True,
        )
        method, _, _ = channel.basic_get("q:tasks", auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=False)
    dead = wait_for(lambda: get_all(topology, "q:tasks:dlq"), what="DLQ message")
    assert [p.message_id for _, p, _ in dead] == ["m-1"]
    death = dead[0][1].headers["x-death"][0]
    assert (death["reason"], death["queue"]) == ("rejected", "q:tasks")


def test_verify_passes_in_sync_and_names_drift(topology: BrokerSettings) -> None:
    ok = run_script(topology, "setup_topology.py", "--verify")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "in sync" in ok.stdout
    with open_channel(topology) as channel:
        channel.queue_unbind("q:tasks:dlq", "tasks.dlx", routing_key="")
    with ManagementClient(topology) as api:
        api._request("DELETE", f"/policies/{topology.vhost}/q-tasks-dlx")
    drift = run_script(topology, "setup_topology.py", "--verify")
    assert drift.returncode == 2
    assert "binding tasks.dlx -> q:tasks:dlq ('') is missing" in drift.stdout
    assert "policy 'q-tasks-dlx' is missing" in drift.stdout
    fixed = run_script(topology, "setup_topology.py")
    assert fixed.returncode == 0, fixed.stderr
    assert "2 created" in fixed.stdout
    assert run_script(topology, "setup_topology.py", "--verify").returncode == 0


def test_conflicting_redeclare_names_queue_and_argument(topology: BrokerSettings) -> None:
    """Scenario S7: a deliberately conflicting declare gives a clear error."""
    data = {
        "queues": [{"name": "q:tasks", "durable": True, "arguments": {"x-max-length": 5}}],
    }
    conflicting = topology_from_definitions(data)
    with pytest.raises(PreconditionFailed) as raised:
        apply_topology(topology, conflicting)
    text = str(raised.value)
    assert "queue 'q:tasks'" in text
    assert "x-max-length" in text
    assert "Fix:" in text
    # the original topology still applies cleanly: nothing was changed
    assert not apply_topology(topology, load_topology()).changed


def test_a_binding_the_broker_refuses_is_named_by_source_destination_and_key(
    vhost: BrokerSettings,
) -> None:
    """Built in code (load_topology would refuse the file): the binding's source exchange
    does not exist on the broker, whose 404 alone names only the exchange."""
    data = {
        "queues": [{"name": "q:bound"}],
        "bindings": [{"source": "no-such-exchange", "destination": "q:bound", "routing_key": "k"}],
    }
    with pytest.raises(NotFound) as raised:
        apply_topology(vhost, topology_from_definitions(data))
    text = str(raised.value)
    assert text.startswith("binding no-such-exchange -> q:bound (routing key 'k'): "), text
    assert "no-such-exchange" in text.split(": ", 1)[1]  # the broker's own reason follows
