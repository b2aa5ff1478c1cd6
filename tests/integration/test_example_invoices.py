"""examples/invoices end to end, on its own topology only, through the scripts a user runs:
setup_topology.py --topology, the example's producer, worker.py --topology --handler, dlq.py.
The lab topology is never applied in these vhosts."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from tests.support import ROOT, parse_lines, ready_count, run_script, script_env

pytestmark = [pytest.mark.integration]
TOPOLOGY = ROOT / "topology" / "invoices.json"
HANDLER = "examples.invoices.handler:handle"
QUEUES = ["q:invoices", "q:invoices:dlq", *(f"q:invoices:wait:{n}" for n in (1, 2, 3))]
GOOD = {"inv-1": ("customer-1", 100), "inv-2": ("customer-2", 200), "inv-3": ("customer-3", 300)}


@pytest.fixture
def invoices(vhost: BrokerSettings) -> BrokerSettings:
    """A fresh vhost with the example's topology applied by setup_topology.py, and no other."""
    result = run_script(vhost, "setup_topology.py", "--topology", str(TOPOLOGY))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "14 created, 0 unchanged" in result.stdout, result.stdout
    return vhost


def produce(settings: BrokerSettings, *args: str) -> list[dict[str, str]]:
    """Run ``python -m examples.invoices.producer`` from the repository root; its lines."""
    result = subprocess.run(
        [sys.executable, "-m", "examples.invoices.producer", *args],
        cwd=ROOT,
        env=script_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return parse_lines(result.stdout)


def work(settings: BrokerSettings, dedup: Path) -> list[dict[str, str]]:
    """Run the worker on the example's topology and handler, backoff retries with tiny waits,
    until 1.5 s idle; its delivery lines."""
    result = run_script(
        settings,
        "worker.py",
        "--topology",
        str(TOPOLOGY),
        "--handler",
        HANDLER,
        "--retry",
        "backoff",
        "--max-attempts",
        "3",
        "--base",
        "0.05",
        "--cap",
        "0.2",
        "--idle-exit",
        "1.5",
        "--dedup-url",
        str(dedup),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return parse_lines(result.stdout)


def outcomes(rows: list[dict[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """message_id -> [(outcome, attempts)] in the order of the worker's lines."""
    by_id: dict[str, list[tuple[str, str]]] = {}
    for row in rows:
        by_id.setdefault(row["message_id"], []).append((row["outcome"], row["attempts"]))
    return by_id


def sent(dedup: Path) -> list[tuple[Any, ...]]:
    """The rows of invoices_sent in the worker's SQLite store."""
    with sqlite3.connect(dedup) as db:
        return db.execute(
            "SELECT invoice_id, customer, amount_cents, message_id FROM invoices_sent "
            "ORDER BY invoice_id"
        ).fetchall()


def dlq(settings: BrokerSettings) -> list[dict[str, Any]]:
    result = run_script(settings, "dlq.py", "--topology", str(TOPOLOGY), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.timeout(120)
def test_invoices_end_to_end_on_their_own_topology(
    invoices: BrokerSettings, tmp_path: Path
) -> None:
    dedup = tmp_path / "invoices-dedup.sqlite3"
    published = produce(invoices, "--count", "3", "--bad", "--flaky")
    assert published == [
        {"message_id": m, "status": "confirmed"}
        for m in ["inv-1", "inv-2", "inv-3", "inv-bad", "inv-flaky"]
    ]

    assert outcomes(work(invoices, dedup)) == {
        "inv-1": [("processed", "1")],
        "inv-2": [("processed", "1")],
        "inv-3": [("processed", "1")],
        "inv-bad": [("dead-lettered", "1")],
        "inv-flaky": [("retried", "1"), ("processed", "2")],  # issue 23: was requeued
    }
    expected_rows = [(i, c, a, i) for i, (c, a) in sorted(GOOD.items())]
    assert sent(dedup) == [*expected_rows, ("inv-flaky", "flaky", 4200, "inv-flaky")]

    (record,) = dlq(invoices)
    assert record["message_id"] == "inv-bad"
    assert record["error"] == {
        "type": "BusinessError",
        "message": "invoice amount_cents must be > 0, got 0",
    }
    assert (record["classification"], record["attempts"]) == ("business", 1)
    assert record["original"] == {"exchange": "invoices", "routing_key": "invoice"}
    assert record["payload"] == {"invoice_id": "inv-bad", "customer": "nobody", "amount_cents": 0}
    assert [ready_count(invoices, q) for q in QUEUES] == [0, 1, 0, 0, 0]

    # the same invoices published again: acked as duplicates, still one row each
    assert len(produce(invoices, "--count", "3", "--flaky")) == 4
    assert outcomes(work(invoices, dedup)) == {
        m: [("duplicate", "1")] for m in ["inv-1", "inv-2", "inv-3", "inv-flaky"]
    }
    assert sent(dedup) == [*expected_rows, ("inv-flaky", "flaky", 4200, "inv-flaky")]

    # only the example's objects exist: no q:tasks, no tasks exchange
    with ManagementClient(invoices) as api:
        assert sorted(q["name"] for q in api.queues(invoices.vhost)) == QUEUES
        assert api.queue(invoices.vhost, "q:tasks") is None
        assert api.exchange(invoices.vhost, "tasks") is None
    verify = run_script(invoices, "setup_topology.py", "--verify", "--topology", str(TOPOLOGY))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "topology in sync" in verify.stdout


@pytest.mark.timeout(120)
def test_a_replayed_invoice_is_handled_again_and_dead_lettered_again(
    invoices: BrokerSettings, tmp_path: Path
) -> None:
    """replay.py --topology puts the DLQ record back on the example's exchange; the handler
    refuses it again (a business error stays one), and the DLQ holds it once."""
    dedup = tmp_path / "invoices-dedup.sqlite3"
    produce(invoices, "--count", "0", "--bad")
    assert outcomes(work(invoices, dedup)) == {"inv-bad": [("dead-lettered", "1")]}
    replayed = run_script(invoices, "replay.py", "--topology", str(TOPOLOGY), "--all")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert parse_lines(replayed.stdout) == [{"message_id": "inv-bad", "status": "replayed"}]
    assert ready_count(invoices, "q:invoices") == 1
    assert outcomes(work(invoices, dedup)) == {"inv-bad": [("dead-lettered", "1")]}
    assert [r["message_id"] for r in dlq(invoices)] == ["inv-bad"]
    with sqlite3.connect(dedup) as db:
        assert (
            db.execute("SELECT name FROM sqlite_master WHERE name = 'invoices_sent'").fetchall()
            == []
        )


@pytest.mark.timeout(120)
def test_invoices_issued_through_the_outbox_reach_the_worker_only_when_committed(
    invoices: BrokerSettings, tmp_path: Path
) -> None:
    """examples.invoices.outbox stores each invoice and its message in one transaction of the
    application's database; scripts/relay.py publishes what committed; the worker handles it.
    The invoice whose transaction rolled back is in neither table and never published."""
    billing = tmp_path / "billing.sqlite3"
    issued = subprocess.run(
        [sys.executable, "-m", "examples.invoices.outbox", "--db", str(billing), "--fail-last"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert issued.returncode == 0, issued.stdout + issued.stderr
    assert issued.stdout.splitlines() == [
        "invoice_id=inv-1 status=committed",
        "invoice_id=inv-2 status=committed",
        "invoice_id=inv-3 status=rolled-back",
    ]
    relay = run_script(invoices, "relay.py", "--outbox-url", str(billing), "--idle-exit", "1")
    assert relay.returncode == 0, relay.stdout + relay.stderr
    assert [r["message_id"] for r in parse_lines(relay.stdout)] == ["inv-1", "inv-2"]
    assert outcomes(work(invoices, tmp_path / "dedup.sqlite3")) == {
        "inv-1": [("processed", "1")],
        "inv-2": [("processed", "1")],
    }
    assert [r[0] for r in sent(tmp_path / "dedup.sqlite3")] == ["inv-1", "inv-2"]
