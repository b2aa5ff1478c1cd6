"""scripts/chaos.py at CI size (N=300, F=3, K=3): SIGKILLed workers, connections force-closed
through the management API (the publisher's mid-publishing too), deliberate duplicates. On
SQLite and on PostgreSQL every confirmed message_id is applied exactly once; with auto-ack the
same run loses messages (scenario S12: early ack loses work when a worker dies, late ack plus
dedup applies it exactly once). The ledger is also read directly, not only through the
summary."""

from __future__ import annotations

import subprocess
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.dedup import open_store
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message
from tests.pgsupport import temp_database
from tests.support import ready_count, run_script, strict_json

pytestmark = pytest.mark.integration

SMALL = ("--messages", "300", "--kills", "3", "--workers", "3")
REQUIRED = (
    "published_confirmed",
    "ledger_rows",
    "distinct_ledger_ids",
    "lost",
    "applied_twice",
    "redeliveries_seen",
    "in_dlq",
)


def chaos(settings: BrokerSettings, *args: str) -> tuple[dict[str, Any], str]:
    result: subprocess.CompletedProcess[str] = run_script(
        settings, "chaos.py", *SMALL, "--json", *args, timeout=200
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary: dict[str, Any] = strict_json(result.stdout.splitlines()[-1])
    assert list(summary)[: len(REQUIRED)] == list(REQUIRED)
    return summary, result.stdout


def ledger_counts(dedup_url: str) -> Counter[str]:
    """message_id -> ledger rows, read straight from the store's database."""
    with closing(open_store(dedup_url)) as store:
        rows = store.run_in_transaction(
            lambda db: db.execute("SELECT message_id FROM ledger").fetchall()
        )
    return Counter(str(m) for (m,) in rows)


def assert_exactly_once(summary: dict[str, Any], dedup_url: str) -> None:
    assert {k: summary[k] for k in REQUIRED if k != "redeliveries_seen"} == {
        "published_confirmed": 300,
        "ledger_rows": 300,
        "distinct_ledger_ids": 300,
        "lost": 0,
        "applied_twice": 0,
        "in_dlq": 0,
    }
    assert summary["redeliveries_seen"] > 0  # the kills and closes really caused redeliveries
    assert summary["kills"] == 3
    assert summary["publisher_closes"] >= 1  # closed mid-publishing ...
    assert summary["publish_retries"] >= 1  # ... and the unconfirmed message was republished
    assert summary["worker_closes"] + summary["publisher_closes"] == 3
    assert summary["duplicates_skipped"] >= 30  # at least the 30 deliberate duplicates
    assert (summary["left_in_queue"], summary["invariant_holds"]) == (0, True)
    counts = ledger_counts(dedup_url)
    assert (len(counts), set(counts.values())) == (300, {1})


@pytest.mark.timeout(240)
def test_crash_test_on_sqlite_applies_every_message_exactly_once(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    url = str(tmp_path / "dedup.sqlite3")
    summary, _ = chaos(topology, "--dedup-url", url)
    assert summary["store"] == "sqlite"
    assert_exactly_once(summary, url)


@pytest.mark.timeout(240)
def test_crash_test_on_postgresql_applies_every_message_exactly_once(
    topology: BrokerSettings,
) -> None:
    with temp_database() as url:
        summary, _ = chaos(topology, "--dedup-url", url)
        assert summary["store"] == "postgresql"
        assert_exactly_once(summary, url)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_crash_test_with_batched_acks_applies_every_message_exactly_once(
    topology: BrokerSettings, tmp_path: Path, store: str
) -> None:
    """Workers SIGKILLed and connections closed mid-batch: process_batch's one transaction per
    batch and the basic.ack multiple=true after its commit still apply each message once."""
    if store == "sqlite":
        url = str(tmp_path / "dedup.sqlite3")
        summary, _ = chaos(topology, "--dedup-url", url, "--ack-batch", "20")
        assert_exactly_once(summary, url)
    else:
        with temp_database() as url:
            summary, _ = chaos(topology, "--dedup-url", url, "--ack-batch", "20")
            assert_exactly_once(summary, url)
    assert summary["store"] == store


@pytest.mark.timeout(240)
def test_crash_test_with_auto_ack_loses_messages(topology: BrokerSettings, tmp_path: Path) -> None:
    url = str(tmp_path / "dedup.sqlite3")
    summary, stdout = chaos(topology, "--dedup-url", url, "--unsafe-auto-ack")
    lost = summary["lost"]
    assert lost > 0, stdout
    assert summary["published_confirmed"] == 300
    assert summary["distinct_ledger_ids"] + lost == 300  # the rest was applied, once each
    assert (summary["applied_twice"], summary["in_dlq"]) == (0, 0)
    assert summary["redeliveries_seen"] == 0  # auto-acked messages are never redelivered
    assert (summary["mode"], summary["invariant_holds"]) == ("unsafe-auto-ack", False)
    assert f"CONTRAST: with auto-ack, {lost} of 300 confirmed messages were lost" in stdout
    counts = ledger_counts(url)
    assert (len(counts), set(counts.values())) == (300 - lost, {1})
    assert ready_count(topology, "q:tasks") == 0  # nothing waits: the lost ones are gone


def test_crash_test_refuses_a_queue_that_is_not_empty(topology: BrokerSettings) -> None:
    with Publisher(topology) as publisher:
        publisher.publish(task_message("ok", 1, "left-over"))
    result = run_script(topology, "chaos.py", *SMALL, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: q:tasks in vhost {topology.vhost!r} is not empty; the crash test needs it empty"
    )
    assert ready_count(topology, "q:tasks") == 1
