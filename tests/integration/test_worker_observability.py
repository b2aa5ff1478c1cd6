"""A running worker as an operator sees it: /metrics scraped while it works (the counters move
to exact values), JSON logs that parse line by line with the trace id the messages carried,
and a metrics port that cannot be bound ending in one error line."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client.parser import text_string_to_metric_families

from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message
from tests.support import run_script, start_script, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPECS = [("ok", "ok-1"), ("ok", "ok-2"), ("flaky", "flaky-1"), ("bad", "bad-1")]
SPECS += [("invalid", "invalid-1"), ("ok", "ok-1")]  # the last: a duplicate message_id


@contextmanager
def in_trace(trace_id: int) -> Iterator[None]:
    """Publish as part of trace ``trace_id`` (with or without an SDK installed)."""
    parent = SpanContext(trace_id, 0x00F067AA0BA902B7, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(parent)):
        yield


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scrape as {(sample name, sorted labels): value}."""
    text = httpx.get(url, timeout=5).text
    assert "_created" not in text  # issue 23: prometheus-client's _created series are off
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scrape: dict[Any, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in scrape.items() if n == name and wanted <= set(ls))


def test_a_scrape_shows_the_counters_and_the_logs_parse_as_json(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    worker = start_script(
        topology,
        "worker.py",
        "--metrics-port",
        "0",
        "--log-format",
        "json",
        "--retry",
        "backoff",
        "--max-attempts",
        "3",
        "--base",
        "0.05",
        "--cap",
        "0.2",
        "--dedup-path",
        str(tmp_path / "dedup.sqlite3"),
    )
    try:
        assert worker.stdout is not None
        first = json.loads(worker.stdout.readline())
        assert first["event"] == "metrics" and first["url"].startswith("http://127.0.0.1:")
        url = first["url"]
        with in_trace(TRACE_ID), Publisher(topology) as publisher:
            for seq, (kind, message_id) in enumerate(SPECS, 1):
                publisher.publish(task_message(kind, seq, message_id))
        labels = {"vhost": topology.vhost, "queue": "q:tasks"}
        scrape = wait_for(
            lambda: (
                (s := samples(url))
                and value(s, "amqp_lab_consumer_dead_lettered_total") == 2
                and value(s, "amqp_lab_consumer_processed_total") == 3
                and value(s, "amqp_lab_consumer_duplicates_total") == 1
                and s
            ),
            timeout=60,
            what="3 processed, 1 duplicate, 2 dead-lettered",
        )
        assert value(scrape, "amqp_lab_consumer_processed_total", **labels) == 3
        assert value(scrape, "amqp_lab_consumer_retried_total", attempt="1") == 2  # flaky, bad
        assert value(scrape, "amqp_lab_consumer_retried_total", attempt="2") == 1  # bad
        assert value(scrape, "amqp_lab_consumer_requeued_total") == 0
        dead = "amqp_lab_consumer_dead_lettered_total"
        assert value(scrape, dead, classification="unknown", error_type="RuntimeError") == 1
        assert value(scrape, dead, classification="business", error_type="BusinessError") == 1
        # handler runs: ok x2, flaky x2, bad x3, invalid x1; the duplicate never runs it
        assert value(scrape, "amqp_lab_consumer_handler_duration_seconds_count") == 8
        assert value(scrape, "amqp_lab_consumer_ack_batch_deliveries_count") == 9
        assert value(scrape, "amqp_lab_consumer_ack_batch_deliveries_sum") == 9
        assert value(scrape, "amqp_lab_consumer_unacked_deliveries", **labels) == 0
        store = "amqp_lab_dedup_store_duration_seconds_count"
        assert value(scrape, store, operation="process_once") == 9
        assert value(scrape, "amqp_lab_consumer_reconnects_total") == 0
        assert value(scrape, "amqp_lab_consumer_blocked_seconds_total") == 0
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]  # every line is one JSON object
    deliveries = [e for e in events if e["event"] == "delivery"]
    assert len(deliveries) == 9
    for event in deliveries:
        assert {"ts", "level", "message_id", "outcome", "attempts", "queue", "vhost"} <= set(event)
        assert (event["queue"], event["vhost"]) == ("q:tasks", topology.vhost)
        # retry copies and the replay path carry the publisher's trace
        assert event["trace_id"] == format(TRACE_ID, "032x")
    bad = [(e["outcome"], e["attempts"]) for e in deliveries if e["message_id"] == "bad-1"]
    assert bad == [("retried", 1), ("retried", 2), ("dead-lettered", 3)]  # issue 23: was requeued
    (invalid,) = [e for e in deliveries if e["message_id"] == "invalid-1"]
    assert invalid["classification"] == "business" and invalid["error_type"] == "BusinessError"
    assert events[-1]["event"] == "worker_stopped" and events[-1]["handled"] == 9
    notices = [json.loads(line) for line in err.splitlines()]  # stderr is JSON lines too
    assert [n["event"] for n in notices if n["event"] == "signal"] == ["signal"]  # the drain
    assert f":{topology.password}@" not in err


def test_a_metrics_port_in_use_is_one_error_line(topology: BrokerSettings, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_script(
            topology,
            "worker.py",
            "--metrics-port",
            str(port),
            "--idle-exit",
            "1",
            "--dedup-path",
            str(tmp_path / "d.sqlite3"),
        )
    assert result.returncode == 1
    assert result.stderr.strip().startswith(f"error: cannot serve metrics on 127.0.0.1:{port}")
    assert "Traceback" not in result.stderr


def test_json_errors_are_json(topology: BrokerSettings, tmp_path: Path) -> None:
    bad = BrokerSettings(topology.amqp_url.replace(topology.vhost, "no-such-vhost"))
    result = run_script(
        bad,
        "worker.py",
        "--log-format",
        "json",
        "--idle-exit",
        "1",
        "--dedup-path",
        str(tmp_path / "d.sqlite3"),
        timeout=60,
    )
    assert result.returncode == 1
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert lines[-1]["event"] == "error" and "no-such-vhost" in lines[-1]["message"]
    assert f":{bad.password}@" not in result.stderr
