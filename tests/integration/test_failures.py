"""Failure paths as first-class behaviour: each case ends in a clear, asserted outcome.

Scenario ids (S*) refer to ../shared/scenarios.md.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pika
import pytest

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.management import ManagementClient
from amqp_lab.message import Task
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from lab.handler import lab_handler, task_message
from tests.brokers import TestBroker
from tests.support import (
    TEST_CONCURRENCY,
    consumer_config,
    get_all,
    ready_count,
    run_script,
    settled_order,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]


def record_effect(task: Task, db: Any) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS effects (message_id TEXT)")
    db.execute("INSERT INTO effects(message_id) VALUES (?)", (task.message_id,))


def effects(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT message_id FROM effects")]


def test_connection_force_closed_while_handler_runs(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Scenario S6: the stale ack is dropped, the message comes back redelivered, dedup keeps
    one effect, the queues end empty."""
    with Publisher(topology) as publisher:
        publisher.publish(task_message("ok", 1, "m-s6"))
    name = f"consumer-{uuid.uuid4().hex[:8]}"
    settings = BrokerSettings(topology.amqp_url, topology.management_url, connection_name=name)
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def handler(task: Task, db: Any) -> None:
        calls.append(task.message_id)
        started.set()
        release.wait(30)
        record_effect(task, db)

    reports: list[DeliveryReport] = []
    consumer = Consumer(
        settings,
        handler,
        SqliteDedupStore(tmp_path / "d.sqlite3"),
        consumer_config(prefetch=1, idle_exit=1.5),
        on_report=reports.append,
    )
    thread = threading.Thread(target=consumer.run)
    thread.start()
    assert started.wait(20)
    with ManagementClient(topology) as api:
        conns = wait_for(
            lambda: [
                c
                for c in api.connections(topology.vhost)
                if c.get("client_properties", {}).get("connection_name") == name
            ],
            what="consumer connection listed",
        )
        api.close_connection(conns[0]["name"], "test: S6")
    release.set()
    thread.join(60)
    assert not thread.is_alive()
    assert calls == ["m-s6"]  # the handler ran once
    assert [(r.message_id, r.outcome, r.redelivered) for r in reports] == [
        ("m-s6", "duplicate", True)
    ]
    assert consumer.connections_opened == 2
    assert effects(tmp_path / "d.sqlite3") == ["m-s6"]
    assert ready_count(topology, "q:tasks") == 0


@pytest.mark.timeout(90)
def test_long_handler_with_short_heartbeat(topology: BrokerSettings, tmp_path: Path) -> None:
    """Scenario S1 (pika #1104, #418): heartbeat 5 s, a 20 s handler, prefetch 1: acked once,
    processed once, no reconnect; 0 ready and 0 unacked at the end."""
    with Publisher(topology) as publisher:
        publisher.publish(task_message("ok", 1, "m-long"))

    def slow(task: Task, db: Any) -> None:
        threading.Event().wait(20)
        record_effect(task, db)

    settings = BrokerSettings(topology.amqp_url, topology.management_url, heartbeat=5)
    reports: list[DeliveryReport] = []
    consumer = Consumer(
        settings,
        slow,
        SqliteDedupStore(tmp_path / "d.sqlite3"),
        consumer_config(prefetch=1, idle_exit=1.0),
        on_report=reports.append,
    )
    assert consumer.run() == 1
    assert consumer.connections_opened == 1
    assert [(r.outcome, r.attempts) for r in reports] == [("processed", 1)]
    assert effects(tmp_path / "d.sqlite3") == ["m-long"]
    with ManagementClient(topology) as api:
        queue = wait_for(
            lambda: (
                (q := api.queue(topology.vhost, "q:tasks"))
                and q.get("messages_unacknowledged") == 0
                and q
            ),
            what="0 unacked",
        )
    assert (queue["messages_ready"], queue["messages_unacknowledged"]) == (0, 0)


BAD_INPUTS: list[tuple[str, bytes, dict[str, Any], str]] = [
    # (message_id, body, extra properties, expected reason fragment)
    ("not-json", b"{nope", {}, "body is not JSON"),
    ("a-list", b"[1, 2]", {}, "must be a JSON object, got list"),
    ("a-number", b"42", {}, "must be a JSON object, got int"),
    ("kind-not-str", b'{"kind": 7}', {}, "'kind' must be a string"),
    ("not-utf8", b"\xff\xfe\xfa", {}, "body is not UTF-8"),
    ("empty", b"", {}, "empty body"),
    # the parser recurses before it finds the body unclosed; the DLQ record keeps it as text
    ("nested-deep", b"[" * 4000, {}, "body is JSON nested too deeply"),
    ("too-big", b'{"kind":"ok","pad":"' + b"x" * 5000 + b'"}', {}, "exceeds the limit of 4096"),
    ("bad-type", b'{"kind":"ok"}', {"content_type": "text/xml"}, "unsupported content_type"),
    (
        "attempts-str",
        b'{"kind":"ok"}',
        {"headers": {"attempts": "3"}},
        "header 'attempts' must be a non-negative integer",
    ),
    ("", b'{"kind":"ok"}', {}, "missing message_id"),
]


def test_bad_input_is_dead_lettered_as_business_error(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    with open_channel(topology) as channel:
        channel.confirm_delivery()
        for message_id, body, extra, _ in BAD_INPUTS:
            props = {
                "content_type": "application/json",
                "delivery_mode": 2,
                "message_id": message_id or None,
                **extra,
            }
            channel.basic_publish(
                "tasks", "task", body, pika.BasicProperties(**props), mandatory=True
            )
        channel.basic_publish(
            "tasks",
            "task",
            b'{"kind":"ok","seq":1}',
            pika.BasicProperties(
                content_type="application/json", message_id="good", delivery_mode=2
            ),
        )
    reports: list[DeliveryReport] = []
    Consumer(
        topology,
        lab_handler,
        SqliteDedupStore(tmp_path / "d.sqlite3"),
        consumer_config(idle_exit=1.5, max_body_bytes=4096),
        on_report=reports.append,
    ).run()
    assert settled_order([(r.outcome, r.attempts) for r in reports]) == settled_order(
        [("dead-lettered", 1)] * len(BAD_INPUTS) + [("processed", 1)]
    )
    records = [json.loads(body) for _, _, body in get_all(topology, "q:tasks:dlq")]
    assert len(records) == len(BAD_INPUTS)
    by_id = {m or None: (m, b, e, reason) for m, b, e, reason in BAD_INPUTS}
    inputs = [by_id[r["message_id"]] for r in records] if TEST_CONCURRENCY > 1 else BAD_INPUTS
    for record, (message_id, _, _, reason) in zip(records, inputs, strict=True):
        assert record["message_id"] == (message_id or None)
        assert record["classification"] == "business"
        assert record["error"]["type"] == "InvalidMessage"
        assert reason in record["error"]["message"], record
    deep = next(r for r in records if r["message_id"] == "nested-deep")
    assert (deep["payload_encoding"], deep["payload"]) == ("text", "[" * 4000)
    assert ready_count(topology, "q:tasks") == 0


def test_least_privilege_user_needs_policymaker(broker: TestBroker, vhost: BrokerSettings) -> None:
    user, password = f"lp-{uuid.uuid4().hex[:8]}", "lp-S3cret-9"
    with broker.admin() as api:
        api.create_user(user, password, tags="management")
        api.set_permissions(vhost.vhost, user)
    try:
        limited = broker.settings(vhost.vhost)
        url = limited.amqp_url.replace(
            f"{broker.username}:{broker.password}@", f"{user}:{password}@"
        )
        settings = BrokerSettings(url, limited.management_url)
        refused = run_script(settings, "setup_topology.py")
        assert refused.returncode == 1
        assert "needs the 'policymaker' tag" in refused.stderr
        assert password not in refused.stdout + refused.stderr
        with broker.admin() as api:
            api.create_user(user, password, tags="policymaker")
        applied = run_script(settings, "setup_topology.py")
        assert applied.returncode == 0, applied.stderr
        published = run_script(settings, "publish.py", "--count", "2")
        assert published.returncode == 0, published.stderr
        assert ready_count(settings, "q:tasks") == 2
    finally:
        with broker.admin() as api:
            api.delete_user(user)


@pytest.mark.restart
@pytest.mark.timeout(180)
def test_sigkill_of_the_broker_keeps_confirmed_persistent_messages(
    broker: TestBroker, vhost: BrokerSettings
) -> None:
    """Case 11: the broker's process killed with SIGKILL, not stopped cleanly."""
    if broker.kill_fn is None:
        pytest.skip("the broker came from EAI_AMQP_URL: the tests cannot kill it")
    with open_channel(vhost) as channel:
        channel.queue_declare("q:kill", durable=True)
    with Publisher(vhost) as publisher:
        for i in range(200):
            message = task_message("ok", i, f"k-{i}", exchange="", routing_key="q:kill")
            publisher.publish(message)
    broker.kill_and_start()
    after = broker.settings(vhost.vhost)

    def recovered() -> bool:  # 4.0 recovers a vhost's queues after the node answers
        try:
            ready_count(after, "q:kill")
        except Exception:
            return False
        return True

    wait_for(recovered, 60, what="q:kill recovered after the restart")
    ids = [p.message_id for _, p, _ in get_all(after, "q:kill")]
    assert ids == [f"k-{i}" for i in range(200)]


def test_every_delivery_is_settled_exactly_once(
    topology: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario S5 (pika #1121): a second ack of the same delivery tag would close the channel
    with 406 unknown delivery tag. Handlers never see the channel; each delivery - processed,
    requeued, dead-lettered, duplicate, in single and in batch mode - is settled exactly once,
    and the channel stays open for the next messages."""
    from pika.adapters.blocking_connection import BlockingChannel

    calls: list[tuple[int, int, bool]] = []  # (channel number, delivery tag, multiple)

    def spy(name: str) -> Any:
        original = getattr(BlockingChannel, name)

        def wrapper(self: Any, delivery_tag: int, **kwargs: Any) -> Any:
            calls.append((self.channel_number, delivery_tag, bool(kwargs.get("multiple"))))
            return original(self, delivery_tag, **kwargs)

        return wrapper

    for name in ("basic_ack", "basic_nack", "basic_reject"):
        monkeypatch.setattr(BlockingChannel, name, spy(name))

    def settled_once() -> int:
        """Replay the calls as the broker would; fail on any tag settled twice."""
        settled: set[tuple[int, int]] = set()
        low: dict[int, int] = {}
        for channel, tag, multiple in calls:
            if multiple:  # covers every outstanding tag up to `tag`
                new = {(channel, t) for t in range(low.get(channel, 0) + 1, tag + 1)} - settled
                assert new, f"basic.ack multiple up to {tag} settles nothing"
                settled |= new
                low[channel] = tag
            else:
                assert (channel, tag) not in settled, f"delivery tag {tag} settled twice"
                settled.add((channel, tag))
        return len(settled)

    kinds = ["ok", "flaky", "invalid", "ok", "bad", "ok"]
    for ack_batch in (1, 4):
        with Publisher(topology) as publisher:
            for i, kind in enumerate(kinds):
                publisher.publish(task_message(kind, i, f"{ack_batch}-{kind}-{i}"))
            publisher.publish(task_message("ok", 9, f"{ack_batch}-ok-0"))  # a duplicate
        calls.clear()
        reports: list[DeliveryReport] = []
        consumer = Consumer(
            topology,
            lab_handler,
            SqliteDedupStore(tmp_path / f"d{ack_batch}.sqlite3"),
            consumer_config(prefetch=4, ack_batch=ack_batch, idle_exit=1.0),
            on_report=reports.append,
        )
        consumer.run()
        assert consumer.connections_opened == 1  # no channel was closed by a double ack
        assert settled_once() == len(reports) == consumer.handled == 9  # 7 + 2 redeliveries
        assert {r.outcome for r in reports} == {
            "processed",
            "requeued",
            "dead-lettered",
            "duplicate",
        }
        assert ready_count(topology, "q:tasks") == 0


def test_cpu_bound_handler_keeps_heartbeats_and_acks_once(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Scenario S13 (dramatiq #461): a CPU-bound handler in the worker thread does not starve
    the connection: heartbeat 2 s, 8 s of pure-Python work, no reconnect, one effect."""
    with Publisher(topology) as publisher:
        publisher.publish(task_message("ok", 1, "m-cpu"))

    def spin(task: Task, db: Any) -> None:
        deadline = time.monotonic() + 8
        n = 0
        while time.monotonic() < deadline:
            n += sum(i * i for i in range(1000))
        record_effect(task, db)

    settings = BrokerSettings(topology.amqp_url, topology.management_url, heartbeat=2)
    reports: list[DeliveryReport] = []
    consumer = Consumer(
        settings,
        spin,
        SqliteDedupStore(tmp_path / "d.sqlite3"),
        consumer_config(prefetch=1, idle_exit=1.0),
        on_report=reports.append,
    )
    consumer.run()
    assert consumer.connections_opened == 1
    assert [(r.message_id, r.outcome) for r in reports] == [("m-cpu", "processed")]
    assert effects(tmp_path / "d.sqlite3") == ["m-cpu"]
