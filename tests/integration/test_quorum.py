"""The quorum variant of the topology on a real broker: setup and verify, the refused switch
of an existing classic vhost, the consumer's retries and DLQ through quorum queues, the
broker-side delivery limit, and what a quorum queue counts toward it on each version
(basic.nack up to 4.2, not from 4.3; basic.reject on every version)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqp_lab.connection import open_channel
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, with_queue_type
from tests.brokers import TestBroker
from tests.support import get_all, publish, ready_count, run_script, run_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.foundation, pytest.mark.timeout(180)]


def version_at_least(broker: TestBroker, major: int, minor: int) -> bool:
    parts = broker.version.split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


@pytest.fixture
def quorum(vhost: BrokerSettings) -> BrokerSettings:
    """The vhost with the quorum variant of the lab topology, delivery limit 2."""
    apply_topology(vhost, with_queue_type(load_topology(), "quorum", delivery_limit=2))
    return vhost


def test_setup_applies_verifies_and_reapplies_the_quorum_variant(
    broker: TestBroker, vhost: BrokerSettings
) -> None:
    first = run_script(vhost, "setup_topology.py", "--queue-type", "quorum")
    assert first.returncode == 0, first.stderr
    # before 4.0 the DLQ's only key (delivery-limit -1) is refused and not needed: no policy
    total = 23 if version_at_least(broker, 4, 0) else 22
    assert f"quorum topology, {total} created, 0 unchanged" in first.stdout
    with ManagementClient(vhost) as api:
        queues = {q["name"]: q for q in api.queues(vhost.vhost)}
    assert len(queues) == 12
    assert {q["type"] for q in queues.values()} == {"quorum"}
    assert queues["q:tasks"]["effective_policy_definition"]["dead-letter-strategy"] == (
        "at-least-once"
    )
    verify = run_script(vhost, "setup_topology.py", "--queue-type", "quorum", "--verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "quorum topology in sync" in verify.stdout
    again = run_script(vhost, "setup_topology.py", "--queue-type", "quorum")
    assert f"{total} unchanged" in again.stdout, again.stdout
    classic = run_script(vhost, "setup_topology.py", "--verify")
    assert classic.returncode == 2
    assert "drift: queue 'q:tasks' arguments" in classic.stdout


def test_a_classic_vhost_cannot_become_quorum_in_place(topology: BrokerSettings) -> None:
    result = run_script(topology, "setup_topology.py", "--queue-type", "quorum")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "queue 'q:tasks' already exists with different properties" in result.stderr
    assert "x-queue-type" in result.stderr
    assert ready_count(topology, "q:tasks") == 0  # nothing was deleted or lost


def test_requeue_then_dlq_record_on_quorum_queues(quorum: BrokerSettings, tmp_path: Path) -> None:
    publish(quorum, ("flaky", "q-flaky"), ("bad", "q-bad"), ("ok", "q-ok"))
    rows = run_worker(quorum, tmp_path)
    outcomes = sorted((r["message_id"], r["outcome"], r["attempts"]) for r in rows)
    assert outcomes == [
        ("q-bad", "dead-lettered", "2"),
        ("q-bad", "requeued", "1"),
        ("q-flaky", "processed", "2"),
        ("q-flaky", "requeued", "1"),
        ("q-ok", "processed", "1"),
    ]
    [(_, properties, _)] = get_all(quorum, "q:tasks:dlq")
    assert properties.message_id == "q-bad"
    assert ready_count(quorum, "q:tasks") == 0


def test_backoff_retries_through_quorum_wait_queues(quorum: BrokerSettings, tmp_path: Path) -> None:
    publish(quorum, ("flaky", "q-wait"))
    rows = run_worker(
        quorum, tmp_path, "--retry", "backoff", "--max-attempts", "3", "--base", "0.2",
        "--cap", "0.5", "--idle-exit", "4",
    )  # fmt: skip
    assert [(r["outcome"], r["attempts"]) for r in rows] == [("retried", "1"), ("processed", "2")]
    with ManagementClient(quorum) as api:
        wait = api.queue(quorum.vhost, "q:tasks:wait:1")
    assert wait is not None and wait["type"] == "quorum"


def _returns(settings: BrokerSettings, how: str, times: int) -> None:
    """basic.get the message of q:tasks and give it back ``times`` times, by ``how``."""
    with open_channel(settings) as channel:
        for _ in range(times):
            method = wait_for(lambda: channel.basic_get("q:tasks")[0], what="the message")
            if how == "reject":
                channel.basic_reject(method.delivery_tag, requeue=True)
            else:
                channel.basic_nack(method.delivery_tag, requeue=True)


def test_past_the_delivery_limit_the_broker_dead_letters_and_replay_brings_it_back(
    quorum: BrokerSettings, tmp_path: Path
) -> None:
    publish(quorum, ("ok", "q-limit"))
    _returns(quorum, "reject", 3)  # limit 2: the third return is one too many
    wait_for(lambda: ready_count(quorum, "q:tasks:dlq") == 1, what="the message in the DLQ")
    assert ready_count(quorum, "q:tasks") == 0
    listed = run_script(quorum, "dlq.py", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (entry["message_id"], entry["error"]["type"]) == (
        "q-limit",
        "dead-lettered:delivery_limit",
    )
    replay = run_script(quorum, "replay.py", "--all", "--audit-log", str(tmp_path / "a.jsonl"))
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.splitlines()[-1] == "1 selected, 1 replayed, 0 failed"
    [(_, properties, _)] = get_all(quorum, "q:tasks")
    assert properties.message_id == "q-limit"
    # a new message, a new count (3.10 shows x-delivery-count 0 on it, later versions none)
    assert (properties.headers or {}).get("x-delivery-count", 0) == 0
    assert ready_count(quorum, "q:tasks:dlq") == 0


def test_what_a_quorum_queue_counts_of_basic_nack_depends_on_the_version(
    broker: TestBroker, quorum: BrokerSettings
) -> None:
    publish(quorum, ("ok", "q-nack"))
    _returns(quorum, "nack", 3)
    if version_at_least(broker, 4, 3):  # 4.3: a nack is not a failed delivery
        [(_, properties, _)] = get_all(quorum, "q:tasks")
        assert "x-delivery-count" not in (properties.headers or {})
        assert ready_count(quorum, "q:tasks:dlq") == 0
    else:  # up to 4.2 every return counts: past the limit of 2, dead-lettered
        wait_for(lambda: ready_count(quorum, "q:tasks:dlq") == 1, what="the message in the DLQ")
        assert ready_count(quorum, "q:tasks") == 0


def test_a_drain_hands_prefetched_deliveries_back_uncounted(
    broker: TestBroker, quorum: BrokerSettings, tmp_path: Path
) -> None:
    if not version_at_least(broker, 4, 3):
        pytest.skip("before 4.3 a quorum queue counts every return, basic.nack included")
    publish(quorum, *[("ok", f"q-drain-{n}") for n in range(8)])
    rows = run_worker(quorum, tmp_path, "--max-messages", "1", "--prefetch", "8")
    assert len(rows) == 1
    left = get_all(quorum, "q:tasks")
    assert len(left) == 7
    counts = [(p.headers or {}).get("x-delivery-count") for _, p, _ in left]
    assert counts == [None] * 7, counts
    assert all(json.loads(body)["kind"] == "ok" for _, _, body in left)
