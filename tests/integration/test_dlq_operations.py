"""DLQ operations at scale: summary, age alert, selective replay of 1,000 records, rate, audit
log, and a message_id replayed twice applied once."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.dlq.ops import replay
from amqp_lab.dlq.record import build_record, record_message
from amqp_lab.dlq.summary import Selection
from amqp_lab.errors import BusinessError
from amqp_lab.message import Task, encode_json
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from tests.support import NAMES, consumer_config, ready_count, run_script, wait_ready_count

pytestmark = pytest.mark.integration


def fill_dlq(settings: BrokerSettings, specs: list[tuple[str, BaseException, float]]) -> None:
    """Publish DLQ records (message_id, error, failed_at seconds) with confirms."""
    with Publisher(settings) as publisher:
        for seq, (message_id, error, failed_at) in enumerate(specs):
            record = build_record(
                body=encode_json({"kind": "ok", "seq": seq}),
                message_id=message_id,
                exchange="tasks",
                routing_key="task",
                queue="q:tasks",
                properties={"content_type": "application/json"},
                headers={"attempts": 0},
                error=error,
                classification="business" if isinstance(error, BusinessError) else "transient",
                attempts=1,
                first_seen_at="2026-01-01T00:00:00.000Z",
                failed_at=failed_at,
            )
            publisher.publish(record_message(record, "tasks.dlx", "task"))


@pytest.fixture
def thousand(topology: BrokerSettings) -> BrokerSettings:
    now = time.time()
    specs: list[tuple[str, BaseException, float]] = []
    for i in range(1000):
        error: BaseException = BusinessError("no customer") if i % 10 < 3 else RuntimeError("bug")
        specs.append((f"m-{i:04d}", error, now - 3600 + i))
    fill_dlq(topology, specs)
    wait_ready_count(topology, "q:tasks:dlq", 1000)
    return topology


@pytest.mark.timeout(300)
def test_summary_and_replay_of_one_error_type_on_1000_records(
    thousand: BrokerSettings, tmp_path: Path
) -> None:
    summary = run_script(thousand, "dlq.py", "--summary", timeout=120)
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert "depth=1000" in lines[0]
    age = int(lines[0].split("oldest_age=")[1].rstrip("s"))
    assert 3590 <= age <= 3700
    assert [line.split() for line in lines[1:]] == [
        ["700", "RuntimeError"],
        ["300", "BusinessError"],
    ]
    assert "records read" not in summary.stderr  # progress only on a terminal, not a pipe
    audit = tmp_path / "audit.jsonl"
    result = run_script(
        thousand,
        "replay.py",
        "--error-type",
        "BusinessError",
        "--audit-log",
        str(audit),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "300 selected, 300 replayed, 0 failed"
    assert "records read" not in result.stderr  # no progress line in a pipe
    wait_ready_count(thousand, "q:tasks:dlq", 700)
    assert ready_count(thousand, "q:tasks") == 300
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    assert len(entries) == 300
    assert {e["status"] for e in entries} == {"replayed"}
    assert {e["error_type"] for e in entries} == {"BusinessError"}
    assert entries[0]["message_id"] == "m-0000" and entries[0]["at"].endswith("Z")
    assert len({e["message_id"] for e in entries}) == 300


def test_alert_age(topology: BrokerSettings) -> None:
    fill_dlq(topology, [("old", RuntimeError("bug"), time.time() - 120)])
    alert = run_script(topology, "dlq.py", "--alert-age", "60")
    assert alert.returncode == 2
    assert alert.stdout.startswith("ALERT: DLQ q:tasks:dlq")
    assert "oldest record is 12" in alert.stdout and "threshold 60s" in alert.stdout
    assert run_script(topology, "dlq.py", "--alert-age", "600").returncode == 0


def test_since_until_limit_and_rate(topology: BrokerSettings) -> None:
    base = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    fill_dlq(
        topology,
        [
            (f"m-{h}", RuntimeError("bug"), (base + timedelta(hours=h)).timestamp())
            for h in range(6)
        ],
    )
    sleeps: list[float] = []
    selection = Selection(since=base + timedelta(hours=1), until=base + timedelta(hours=4))
    results = replay(
        topology, selection.matches, queue=NAMES.dlq, limit=3, rate=20, sleep=sleeps.append
    )
    assert [r.entry.message_id for r in results] == ["m-1", "m-2", "m-3"]
    assert sleeps == [0.05, 0.05]  # 20 per second, nothing before the first
    wait_ready_count(topology, "q:tasks:dlq", 3)
    cli = run_script(topology, "replay.py", "--since", "2026-01-01T16:00:00Z", "--dry-run")
    assert [line.split()[0] for line in cli.stdout.splitlines()[:-1]] == [
        "message_id=m-4",
        "message_id=m-5",
    ]


def test_replaying_a_message_twice_applies_it_once(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    now = time.time()
    fill_dlq(topology, [("twice", RuntimeError("bug"), now), ("twice", RuntimeError("bug"), now)])
    assert (
        run_script(
            topology, "replay.py", "--all", "--audit-log", str(tmp_path / "a.jsonl")
        ).returncode
        == 0
    )
    applied: list[str] = []

    def fixed_handler(task: Task, db: Any) -> None:
        applied.append(task.message_id)

    reports: list[DeliveryReport] = []
    Consumer(
        topology,
        fixed_handler,
        SqliteDedupStore(tmp_path / "d.sqlite3"),
        consumer_config(idle_exit=1.0),
        on_report=reports.append,
    ).run()
    assert [r.outcome for r in reports] == ["processed", "duplicate"]
    assert applied == ["twice"]
