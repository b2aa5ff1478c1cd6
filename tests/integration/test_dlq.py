"""dlq.py (browse without consuming, --json, --alert-depth) and replay.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqp_lab.settings import BrokerSettings
from tests.support import (
    NAMES,
    get_all,
    parse_lines,
    publish,
    ready_count,
    run_script,
    run_worker,
    strict_json,
    wait_ready_count,
)

pytestmark = [pytest.mark.integration, pytest.mark.foundation]


@pytest.fixture
def dead(topology: BrokerSettings, tmp_path: Path) -> BrokerSettings:
    """A vhost whose DLQ holds records for m-bad (attempts 2) and m-invalid (attempts 1)."""
    publish(topology, ("bad", "m-bad"), ("invalid", "m-invalid"), ("ok", "m-ok"))
    run_worker(topology, tmp_path)
    wait_ready_count(topology, "q:tasks:dlq", 2)
    return topology


def test_listing_does_not_consume_and_keeps_order(dead: BrokerSettings) -> None:
    first = run_script(dead, "dlq.py", "--json")
    second = run_script(dead, "dlq.py", "--json")
    assert first.returncode == 0, first.stderr
    rows = [strict_json(line) for line in first.stdout.splitlines()]
    assert [r["message_id"] for r in rows] == [
        strict_json(line)["message_id"] for line in second.stdout.splitlines()
    ]
    assert sorted(r["message_id"] for r in rows) == ["m-bad", "m-invalid"]
    wait_ready_count(dead, "q:tasks:dlq", 2)
    by_id = {r["message_id"]: r for r in rows}
    assert by_id["m-bad"]["attempts"] == 2
    assert by_id["m-bad"]["error"]["type"] == "RuntimeError"
    assert by_id["m-invalid"]["classification"] == "business"
    assert by_id["m-invalid"]["payload"] == {"kind": "invalid", "seq": 2}
    assert by_id["m-invalid"]["first_seen_at"].endswith("Z")
    table = run_script(dead, "dlq.py")
    assert "2 message(s) in q:tasks:dlq" in table.stdout
    assert "m-bad" in table.stdout and "RuntimeError" in table.stdout


def test_alert_depth(dead: BrokerSettings) -> None:
    alert = run_script(dead, "dlq.py", "--alert-depth", "1")
    assert alert.returncode == 2
    assert len(alert.stdout.strip().splitlines()) == 1
    assert alert.stdout.startswith("ALERT: DLQ q:tasks:dlq")
    assert "holds 2 messages (threshold 1)" in alert.stdout
    quiet = run_script(dead, "dlq.py", "--alert-depth", "2")
    assert quiet.returncode == 0


def test_dry_run_changes_nothing(dead: BrokerSettings) -> None:
    result = run_script(dead, "replay.py", "--all", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert sorted(r["status"] for r in parse_lines(result.stdout)) == ["would-replay"] * 2
    wait_ready_count(dead, "q:tasks:dlq", 2)
    assert ready_count(dead, "q:tasks") == 0


def test_replay_one_message_id(dead: BrokerSettings) -> None:
    result = run_script(dead, "replay.py", "--message-id", "m-invalid")
    assert result.returncode == 0, result.stderr
    assert parse_lines(result.stdout) == [{"message_id": "m-invalid", "status": "replayed"}]
    wait_ready_count(dead, "q:tasks:dlq", 1)
    ((_, props, body),) = get_all(dead, "q:tasks")
    assert props.message_id == "m-invalid"
    assert props.headers == {"attempts": 0}
    assert json.loads(body) == {"kind": "invalid", "seq": 2}
    missing = run_script(dead, "replay.py", "--message-id", "nope")
    assert missing.returncode == 1


def test_replay_all_republishes_original_and_empties_dlq(
    dead: BrokerSettings, tmp_path: Path
) -> None:
    result = run_script(dead, "replay.py", "--all")
    assert result.returncode == 0, result.stderr
    wait_ready_count(dead, "q:tasks:dlq", 0)
    replayed = {p.message_id: (p, json.loads(b)) for _, p, b in get_all(dead, "q:tasks")}
    assert set(replayed) == {"m-bad", "m-invalid"}
    props, body = replayed["m-bad"]
    assert body == {"kind": "bad", "seq": 1}
    assert props.headers == {"attempts": 0}
    assert props.delivery_mode == 2


def test_replay_of_reject_mode_message_strips_x_death(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    publish(topology, ("invalid", "m-invalid"))
    run_worker(topology, tmp_path, "--dead-letter", "reject")
    listed = [strict_json(x) for x in run_script(topology, "dlq.py", "--json").stdout.splitlines()]
    assert [(r["message_id"], r["source"], r["error"]["type"]) for r in listed] == [
        ("m-invalid", "x-death", "dead-lettered:rejected")
    ]
    assert run_script(topology, "replay.py", "--all").returncode == 0
    ((_, props, body),) = get_all(topology, "q:tasks")
    assert props.message_id == "m-invalid"
    assert props.headers == {"attempts": 0}
    assert json.loads(body) == {"kind": "invalid", "seq": 1}


def test_failed_replay_keeps_the_dlq_copy(dead: BrokerSettings) -> None:
    from amqp_lab.dlq.ops import replay

    results = replay(
        dead, lambda e: e.message_id == "m-bad", queue=NAMES.dlq, exchange="no-such-exchange"
    )
    assert [(r.entry.message_id, r.status) for r in results] == [("m-bad", "failed")]
    assert "404" in results[0].detail
    wait_ready_count(dead, "q:tasks:dlq", 2)
