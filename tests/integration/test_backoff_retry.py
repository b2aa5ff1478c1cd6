"""Broker-held delayed retries: wait queues per attempt, our attempts header, DLQ after N."""

from __future__ import annotations

import itertools
import json
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pika
import pytest

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.dlq.record import record_message
from amqp_lab.errors import TransientError
from amqp_lab.message import Task
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.retry.broker_held import wait_bound
from amqp_lab.retry.policy import RetryPolicy
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message
from tests.support import (
    consumer_config,
    get_all,
    lines_for,
    publish,
    ready_count,
    run_script,
    run_worker,
)

pytestmark = [pytest.mark.integration, pytest.mark.foundation]
WAIT_QUEUES = [f"q:tasks:wait:{n}" for n in range(1, 10)]
TOLERANCE = 0.6  # seconds: broker expiry timer + consumer round trip on a loaded 2-core box


def test_seed_scenario_bad_message_five_attempts(topology: BrokerSettings, tmp_path: Path) -> None:
    publish(topology, ("bad", "m-bad"))
    rows = run_worker(
        topology,
        tmp_path,
        "--retry",
        "backoff",
        "--max-attempts",
        "5",
        "--base",
        "0.05",
        "--cap",
        "1",
    )
    assert lines_for(rows, "m-bad") == [  # issue 23: retried (was requeued)
        ("retried", "1", "false"),
        ("retried", "2", "false"),
        ("retried", "3", "false"),
        ("retried", "4", "false"),
        ("dead-lettered", "5", "false"),
    ]
    assert ready_count(topology, "q:tasks") == 0
    assert [ready_count(topology, q) for q in WAIT_QUEUES] == [0] * 9
    ((_, props, body),) = get_all(topology, "q:tasks:dlq")
    record = json.loads(body)
    assert record["attempts"] == 5
    assert record["payload"] == {"kind": "bad", "seq": 1}
    assert record["error"]["type"] == "RuntimeError"
    assert record["first_seen_at"].endswith("Z")
    # put it back and replay it: DLQ empty, q:tasks holds it with attempts 0
    with Publisher(topology) as publisher:
        publisher.publish(record_message(record, "tasks.dlx", "task"))
    assert (
        run_script(
            topology, "replay.py", "--all", "--audit-log", str(tmp_path / "audit.jsonl")
        ).returncode
        == 0
    )
    assert ready_count(topology, "q:tasks:dlq") == 0
    ((_, props, body),) = get_all(topology, "q:tasks")
    assert (props.message_id, props.headers) == ("m-bad", {"attempts": 0})


def run_consumer(
    settings: BrokerSettings,
    tmp_path: Path,
    handler: Any,
    policy: RetryPolicy,
    uniform: Any,
    idle: float = 3.0,
) -> list[DeliveryReport]:
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(tmp_path / f"dedup-{time.monotonic_ns()}.sqlite3")
    Consumer(
        settings,
        handler,
        store,
        consumer_config(prefetch=10, idle_exit=idle, retry=policy),
        on_report=reports.append,
        uniform=uniform,
    ).run()
    return reports


def test_waits_between_deliveries_are_the_capped_exponential(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """With the jitter pinned at its upper bound, each gap equals min(cap, base*2**(n-1))."""
    policy = RetryPolicy("backoff", max_attempts=5, base=0.2, cap=0.8)
    seen: list[float] = []

    def always_transient(task: Task, db: Any) -> None:
        seen.append(time.monotonic())
        raise TransientError("503 from upstream")

    publish(topology, ("ok", "m-gaps"))
    reports = run_consumer(topology, tmp_path, always_transient, policy, lambda lo, hi: hi)
    assert [r.attempts for r in reports] == [1, 2, 3, 4, 5]
    assert [r.wait for r in reports] == [0.2, 0.4, 0.8, 0.8, None]
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    bounds = [wait_bound(policy, n) for n in (1, 2, 3, 4)]
    assert bounds == [0.2, 0.4, 0.8, 0.8]
    for gap, bound in zip(gaps, bounds, strict=True):
        assert bound - 0.05 <= gap <= bound + TOLERANCE, (gaps, bounds)
    assert [ready_count(topology, q) for q in WAIT_QUEUES] == [0] * 9
    assert ready_count(topology, "q:tasks:dlq") == 1


def test_jittered_gaps_stay_within_their_bounds(topology: BrokerSettings, tmp_path: Path) -> None:
    policy = RetryPolicy("backoff", max_attempts=4, base=0.2, cap=0.5)
    seen: list[float] = []

    def always_transient(task: Task, db: Any) -> None:
        seen.append(time.monotonic())
        raise TimeoutError("upstream timed out")

    publish(topology, ("ok", "m-jitter"))
    reports = run_consumer(topology, tmp_path, always_transient, policy, random.uniform)
    assert [r.outcome for r in reports] == ["retried"] * 3 + ["dead-lettered"]
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    for n, gap in enumerate(gaps, 1):
        assert 0 <= gap <= wait_bound(policy, n) + TOLERANCE, gaps


def test_short_wait_is_not_stuck_behind_a_long_one(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Scenario S9 (rabbitmq-server #2007): A (attempt 4, waits 8 s) is published before B
    (attempt 1, waits 1 s); B comes back within its own bound because they wait in different
    queues."""
    policy = RetryPolicy("backoff", max_attempts=5, base=1.0, cap=30)
    first_seen: dict[str, float] = {}
    returned: dict[str, float] = {}

    def fail_once(task: Task, db: Any) -> None:
        now = time.monotonic()
        if task.message_id not in first_seen:
            first_seen[task.message_id] = now
            raise TransientError("503")
        returned[task.message_id] = now

    with Publisher(topology) as publisher:
        long = task_message("ok", 1, "A-long")
        publisher.publish(replace(long, headers={"attempts": 3}))
        publisher.publish(task_message("ok", 2, "B-short"))
    reports = run_consumer(topology, tmp_path, fail_once, policy, lambda lo, hi: hi, idle=10)
    assert {(r.message_id, r.outcome, r.wait) for r in reports if r.wait} == {
        ("A-long", "retried", 8.0),
        ("B-short", "retried", 1.0),
    }
    b_wait = returned["B-short"] - first_seen["B-short"]
    a_wait = returned["A-long"] - first_seen["A-long"]
    assert 0.95 <= b_wait <= 1.0 + TOLERANCE, b_wait
    assert 7.95 <= a_wait <= 8.0 + TOLERANCE, a_wait


def test_one_shared_wait_queue_would_block_the_short_wait(vhost: BrokerSettings) -> None:
    """The broker behaviour the design avoids, shown: per-message TTL expires only at the head."""
    with open_channel(vhost) as channel:
        channel.queue_declare("back", durable=True)
        channel.queue_declare(
            "wait",
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "back"},
        )
        channel.confirm_delivery()
        started = time.monotonic()
        for message_id, ms in (("A", "3000"), ("B", "300")):
            channel.basic_publish(
                "",
                "wait",
                b"{}",
                pika.BasicProperties(message_id=message_id, expiration=ms, delivery_mode=2),
                mandatory=True,
            )
        arrivals: dict[str, float] = {}
        deadline = started + 10
        while len(arrivals) < 2 and time.monotonic() < deadline:
            method, props, _ = channel.basic_get("back", auto_ack=True)
            if method is None:
                time.sleep(0.02)
                continue
            arrivals[props.message_id] = time.monotonic() - started
    assert arrivals["B"] >= 2.9  # B (300 ms) waited for A (3 s) at the head
    assert arrivals["B"] - arrivals["A"] < 0.5


def test_worker_refuses_backoff_without_wait_queues(vhost: BrokerSettings, tmp_path: Path) -> None:
    with open_channel(vhost) as channel:
        channel.queue_declare("q:tasks", durable=True)
    result = run_script(
        vhost,
        "worker.py",
        "--retry",
        "backoff",
        "--idle-exit",
        "1",
        "--dedup-path",
        str(tmp_path / "d.sqlite3"),
    )
    assert result.returncode == 1
    assert "wait queue 'q:tasks:wait:1' does not exist" in result.stderr
