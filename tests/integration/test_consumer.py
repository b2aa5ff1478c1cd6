"""worker.py and Consumer: every outcome with exact delivery counts, DLQ records, reject mode,
de-duplication, prefetch, a consumer killed before its ack, heartbeats during a long handler."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.management import ManagementClient
from amqp_lab.message import Task
from amqp_lab.settings import BrokerSettings
from tests.support import (
    ROOT,
    consumer_config,
    get_all,
    lines_for,
    publish,
    ready_count,
    run_worker,
    script_env,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.foundation]


def test_every_outcome_with_exact_delivery_counts(topology: BrokerSettings, tmp_path: Path) -> None:
    """Scenario S8 too: the transient failure is delivered exactly twice, never looped."""
    publish(
        topology, ("ok", "m-ok"), ("flaky", "m-flaky"), ("bad", "m-bad"), ("invalid", "m-invalid")
    )
    rows = run_worker(topology, tmp_path, "--prefetch", "1")
    assert lines_for(rows, "m-ok") == [("processed", "1", "false")]
    assert lines_for(rows, "m-flaky") == [("requeued", "1", "false"), ("processed", "2", "true")]
    assert lines_for(rows, "m-bad") == [("requeued", "1", "false"), ("dead-lettered", "2", "true")]
    assert lines_for(rows, "m-invalid") == [("dead-lettered", "1", "false")]
    assert len(rows) == 6
    assert ready_count(topology, "q:tasks") == 0
    records = {p.message_id: json.loads(body) for _, p, body in get_all(topology, "q:tasks:dlq")}
    assert set(records) == {"m-bad", "m-invalid"}
    assert records["m-bad"]["attempts"] == 2
    assert records["m-bad"]["classification"] == "unknown"  # retried like transient: a bug
    assert records["m-bad"]["error"]["type"] == "RuntimeError"
    assert records["m-invalid"]["attempts"] == 1
    assert records["m-invalid"]["classification"] == "business"
    with sqlite3.connect(tmp_path / "dedup.sqlite3") as db:
        effects = sorted(r[0] for r in db.execute("SELECT message_id FROM effects"))
    assert effects == ["m-flaky", "m-ok"]


def test_dlq_record_carries_what_a_person_needs(topology: BrokerSettings, tmp_path: Path) -> None:
    publish(topology, ("bad", "m-bad"))
    run_worker(topology, tmp_path)
    ((_, props, body),) = get_all(topology, "q:tasks:dlq")
    record = json.loads(body)
    assert props.message_id == "m-bad"
    assert props.type == "dlq-record"
    assert props.delivery_mode == 2
    assert record["message_id"] == "m-bad"
    assert record["payload"] == {"kind": "bad", "seq": 1}
    error = record["error"]
    assert (error["type"], error["message"]) == (
        "RuntimeError",
        "bug in task handler: division by zero",
    )
    assert 'in lab_handler\n    raise RuntimeError("bug in task handler' in error["traceback"]
    assert record["attempts"] == 2
    assert record["original"] == {"exchange": "tasks", "routing_key": "task", "queue": "q:tasks"}
    first = datetime.fromisoformat(record["first_seen_at"])
    last = datetime.fromisoformat(record["last_failed_at"])
    assert record["first_seen_at"].endswith("Z")
    assert first.tzinfo is not None
    assert 0 < (last - first).total_seconds() < 30  # first receipt kept across the redelivery


def test_reject_mode_lets_the_policy_dlx_add_x_death(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    publish(topology, ("invalid", "m-invalid"), ("bad", "m-bad"))
    rows = run_worker(topology, tmp_path, "--dead-letter", "reject")
    assert lines_for(rows, "m-invalid") == [("dead-lettered", "1", "false")]
    assert lines_for(rows, "m-bad")[-1] == ("dead-lettered", "2", "true")
    dead = {p.message_id: (p, body) for _, p, body in get_all(topology, "q:tasks:dlq")}
    assert set(dead) == {"m-invalid", "m-bad"}
    props, body = dead["m-invalid"]
    assert json.loads(body) == {"kind": "invalid", "seq": 1}  # the original message, moved
    (death,) = props.headers["x-death"]
    assert death["reason"] == "rejected"
    assert death["queue"] == "q:tasks"
    assert death["exchange"] == "tasks"
    assert death["routing-keys"] == ["task"]
    assert death["count"] == 1


def test_duplicate_message_id_is_processed_once(topology: BrokerSettings, tmp_path: Path) -> None:
    publish(topology, ("ok", "same-id"), ("ok", "same-id"), ("ok", "other"))
    rows = run_worker(topology, tmp_path)
    assert lines_for(rows, "same-id") == [("processed", "1", "false"), ("duplicate", "1", "false")]
    with sqlite3.connect(tmp_path / "dedup.sqlite3") as db:
        count = db.execute("SELECT count(*) FROM effects WHERE message_id='same-id'").fetchone()
    assert count == (1,)
    assert ready_count(topology, "q:tasks") == 0


def test_prefetch_bounds_unacked_deliveries(topology: BrokerSettings, tmp_path: Path) -> None:
    publish(topology, *[("ok", f"m-{i}") for i in range(20)])
    release = threading.Event()

    def held(task: Task, db: Any) -> None:
        release.wait(60)

    store = SqliteDedupStore(tmp_path / "dedup.sqlite3")
    consumer = Consumer(
        topology,
        held,
        store,
        consumer_config(prefetch=5, idle_exit=1.0),
        on_report=lambda r: None,
    )
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        with ManagementClient(topology) as api:
            stats = wait_for(
                lambda: (
                    (q := api.queue(topology.vhost, "q:tasks"))
                    and q.get("messages_unacknowledged") == 5
                    and q.get("messages_ready") == 15
                    and q
                ),
                what="5 unacked / 15 ready",
            )
        assert stats["messages_unacknowledged"] == 5
    finally:
        release.set()
        thread.join(60)
    assert consumer.handled == 20
    assert ready_count(topology, "q:tasks") == 0


KILLABLE_CONSUMER = textwrap.dedent("""
    import sys, time
    from amqp_lab.consuming.consumer import Consumer, ConsumerConfig
    from amqp_lab.dedup import SqliteDedupStore
    from amqp_lab.settings import BrokerSettings
    from amqp_lab.topology import load_topology
    import os

    def handler(task, db):
        print("handling", task.message_id, flush=True)
        time.sleep(600)

    settings = BrokerSettings(os.environ["EAI_AMQP_URL"], os.environ.get("EAI_MGMT_URL"))
    config = ConsumerConfig(load_topology().names, prefetch=1)
    Consumer(settings, handler, SqliteDedupStore(sys.argv[1]), config).run()
""")


def test_consumer_killed_before_ack_gets_redelivery(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Scenario S12 (celery #1628), the manual-ack half: kill -9 before the ack, and the
    message comes back redelivered instead of being lost."""
    publish(topology, ("ok", "m-killed"))
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLABLE_CONSUMER, str(tmp_path / "killed.sqlite3")],
        env=script_env(topology),
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "handling m-killed"
        assert ready_count(topology, "q:tasks") == 0  # it is unacked, held by the consumer
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    wait_for(lambda: ready_count(topology, "q:tasks") == 1, what="message back in q:tasks")
    rows = run_worker(topology, tmp_path)
    # a run that never finished is no failure: the same attempt again (the store's poison
    # count, max_redeliveries, is what stops a message that keeps killing workers)
    assert lines_for(rows, "m-killed") == [("processed", "1", "true")]


def test_heartbeats_flow_while_a_long_handler_runs(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Scenario S1 (pika #1104): heartbeat 2 s, a handler of 10 s; no reconnect, acked once."""
    publish(topology, ("ok", "m-long"))
    reports: list[DeliveryReport] = []

    def slow(task: Task, db: Any) -> None:
        threading.Event().wait(10)

    settings = BrokerSettings(topology.amqp_url, topology.management_url, heartbeat=2)
    store = SqliteDedupStore(tmp_path / "dedup.sqlite3")
    consumer = Consumer(
        settings,
        slow,
        store,
        consumer_config(prefetch=1, idle_exit=1.0),
        on_report=reports.append,
    )
    assert consumer.run() == 1
    assert consumer.connections_opened == 1
    assert [(r.message_id, r.outcome, r.attempts) for r in reports] == [("m-long", "processed", 1)]
    assert ready_count(topology, "q:tasks") == 0


@pytest.mark.timeout(150)
def test_a_stream_of_deliveries_longer_than_two_heartbeat_checks_keeps_its_connection(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """The consumer's frame loop (amqp_lab.frame_reader) counts the bytes it reads, which
    pika's heartbeat checker compares every timeout + 5 s: heartbeat 1 s, 700 deliveries
    streaming for about 15 s (prefetch 4, 20 ms a handler: RabbitMQ sends no heartbeat while
    it sends deliveries), so only the frame loop's count shows the checker the connection is
    alive. Every delivery processed once, on one connection, with the body published."""
    count = 700
    publish(topology, *[("ok", f"m-{i}") for i in range(count)])
    reports: list[DeliveryReport] = []
    bodies: dict[str, Any] = {}

    def slow(task: Task, db: Any) -> None:
        bodies[task.message_id] = task.body
        threading.Event().wait(0.02)

    settings = BrokerSettings(topology.amqp_url, topology.management_url, heartbeat=1)
    store = SqliteDedupStore(tmp_path / "dedup.sqlite3")
    config = consumer_config(prefetch=4, concurrency=1, idle_exit=1.5)
    consumer = Consumer(settings, slow, store, config, on_report=reports.append)
    assert consumer.run() == count
    assert consumer.connections_opened == 1
    processed = sorted(str(r.message_id) for r in reports if r.outcome == "processed")
    assert processed == sorted(f"m-{i}" for i in range(count))
    assert len(reports) == count
    assert bodies["m-7"] == {"kind": "ok", "seq": 8}
    assert ready_count(topology, "q:tasks") == 0


def test_max_messages_stops_and_leaves_the_rest(topology: BrokerSettings, tmp_path: Path) -> None:
    publish(topology, *[("ok", f"m-{i}") for i in range(5)])
    rows = run_worker(topology, tmp_path, "--max-messages", "2", "--prefetch", "3")
    assert [r["outcome"] for r in rows] == ["processed", "processed"]
    assert wait_for(lambda: ready_count(topology, "q:tasks") == 3, what="3 left in q:tasks")
