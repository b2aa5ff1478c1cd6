"""scripts/chaos.py --ordered at CI size (200 messages over 10 keys, 2 shards, 2 workers, 2
kills, 2 forced closes, every seq % 7 == 3 failing once): per key, every confirmed message is
applied once and in seq order through the kills, takeovers and in-worker retries. The ledger
is also read directly, not only through the summary."""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.settings import BrokerSettings
from lab.chaos_ordered import parse_message_id
from tests.support import run_script, strict_json

pytestmark = [
    pytest.mark.integration,
    pytest.mark.failure_model,
    pytest.mark.no_plain_consumer,
]

SMALL = ("--messages", "200", "--keys", "10", "--shards", "2", "--workers", "2")
CHAOS = ("--kills", "2", "--closes", "2", "--work-ms", "10", "--seed", "14")


@pytest.mark.timeout(240)
def test_ordered_crash_test_keeps_every_key_in_order(vhost: BrokerSettings, tmp_path: Path) -> None:
    url = str(tmp_path / "dedup.sqlite3")
    result = run_script(
        vhost, "chaos.py", "--ordered", *SMALL, *CHAOS, "--dedup-url", url, "--json", timeout=200
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary: dict[str, Any] = strict_json(result.stdout.splitlines()[-1])
    assert {
        k: summary[k]
        for k in ("published_confirmed", "keys", "lost", "applied_twice", "out_of_order", "in_dlq")
    } == {
        "published_confirmed": 200,
        "keys": 10,
        "lost": 0,
        "applied_twice": 0,
        "out_of_order": 0,
        "in_dlq": 0,
    }, output
    assert summary["kills"] >= 1
    assert summary["transient_failures_injected"] >= 1
    assert summary["held_retries"] >= 1  # the failures were retried in the worker, held
    assert summary["redeliveries_seen"] > 0
    assert (summary["left_in_queue"], summary["invariant_holds"]) == (0, True)
    with sqlite3.connect(url) as db:
        rows = db.execute("SELECT message_id FROM ledger ORDER BY rowid").fetchall()
    per_key: dict[str, list[int]] = defaultdict(list)
    for (message_id,) in rows:
        parsed = parse_message_id(message_id)
        assert parsed is not None
        per_key[parsed[0]].append(parsed[1])
    assert len(per_key) == 10
    assert all(seqs == list(range(1, 21)) for seqs in per_key.values()), dict(per_key)
