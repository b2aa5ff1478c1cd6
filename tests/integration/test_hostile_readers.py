"""Property (issue 21, item 4): a foreign publisher - plain pika, not amqp-lab's publisher -
sends arbitrary legal properties, headers and bodies into the work queue, the DLQ and the
audit stream; the worker runs over them, and then every tool that reads broker data does, as a
library and as a script: the DLQ browser (``dlq.py``, table, ``--json``, ``--summary``),
replay (``replay.py``, dry run and real), the console (Flask test client), ``keys.py`` (DLQ
and audit), the stream audit reader (``audit.py``) and the exporter. Each message gets an
outcome - shown, or skipped with a reason - none stops a tool, no traceback, every text line
is one line per event and every ``--json`` output parses as standard JSON."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqp_lab.audit import StreamEntry, StreamReader
from amqp_lab.console import create_app
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.dlq.fingerprint import group
from amqp_lab.dlq.ops import browse, depth, replay
from amqp_lab.dlq.view import DlqEntry
from amqp_lab.exporters.queues import probe_queues
from amqp_lab.ordering.key_sources import dlq_keys, queue_keys
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, with_stream_audit
from amqp_lab.wire import AmqpProperties
from lab.handler import lab_handler
from tests.amqp_values import foreign_bodies, foreign_properties
from tests.support import (
    NAMES,
    ROOT,
    consumer_config,
    ready_count,
    run_script,
    script_env,
    strict_json,
    strict_json_lines,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]

AUDIT = "q:tasks:audit"
TARGETS = {  # where a foreign publisher sends: (exchange, routing key)
    "work": (NAMES.exchange, NAMES.routing_key),  # the work queue and the audit stream
    "dlq": ("", NAMES.dlq),
    "audit": ("", AUDIT),
}


def _has_decimal(value: Any) -> bool:
    if isinstance(value, Decimal):
        return True
    if isinstance(value, dict):
        return any(_has_decimal(v) for v in value.values())
    return isinstance(value, list) and any(_has_decimal(v) for v in value)


def stream_accepts(fields: dict[str, Any]) -> bool:
    """What a stream accepts: a message with a decimal header (3.10, 4.0, 4.3) or a reply_to
    that is not UTF-8 (4.3) routed to a stream closes the publisher's connection with 541
    INTERNAL_ERROR; a classic queue takes both
    (test_audit_stream::test_what_a_stream_refuses_on_its_way_in)."""
    return not _has_decimal(fields.get("headers")) and not isinstance(fields.get("reply_to"), bytes)


batches = st.lists(
    st.tuples(st.sampled_from(sorted(TARGETS)), foreign_properties, foreign_bodies).filter(
        lambda m: m[0] == "dlq" or stream_accepts(m[1])
    ),
    min_size=1,
    max_size=6,
)


@pytest.fixture
def stream_topology(vhost: BrokerSettings) -> BrokerSettings:
    """The lab topology with the audit queue as a stream (setup_topology.py --audit stream)."""
    apply_topology(vhost, with_stream_audit(load_topology(), max_length_bytes=50_000_000))
    return vhost


Batch = list[tuple[str, dict[str, Any], bytes]]


def publish_foreign(settings: BrokerSettings, batch: Batch) -> int:
    """Publish ``batch`` with plain pika (confirms, mandatory); properties encoded by the
    lossless codec, since pika's own cannot encode a float. Returns how many reached the
    audit stream."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for target, fields, body in batch:
            exchange, routing_key = TARGETS[target]
            channel.basic_publish(
                exchange, routing_key, body, AmqpProperties(**fields), mandatory=True
            )
    finally:
        connection.close()
    return sum(target in ("work", "audit") for target, _, _ in batch)


def check_entries(entries: list[DlqEntry]) -> None:
    for entry in entries:
        assert entry.source in ("record", "x-death", "raw"), entry  # read, not just survived
        strict_json(json.dumps(entry.as_dict(), allow_nan=False))


def check_console(settings: BrokerSettings, tmp_path: Path, entries: list[DlqEntry]) -> None:
    """Every page the console shows for this DLQ answers, none with an error page."""
    app = create_app(settings, NAMES, token=None, audit_log=tmp_path / "audit.jsonl")
    app.testing = True
    client = app.test_client()
    index = client.get("/")
    assert index.status_code == 200, index.text[-2000:]
    for g in group(entries)[:4]:
        page = client.get(f"/group/{g.id}")
        assert page.status_code == 200, page.text[-2000:]
        named = [e for e in g.entries if e.message_id][:1]
        for e in named:
            record = client.get(f"/group/{g.id}/record", query_string={"message_id": e.message_id})
            assert record.status_code == 200, record.text[-2000:]
    if entries:
        preview = client.get(f"/group/{group(entries)[0].id}/replay")
        assert preview.status_code in (200, 404), preview.text[-2000:]


class Totals:
    """What the examples sent, summed: the stream cannot be emptied between them."""

    audit = 0


@pytest.mark.timeout(300)
def test_every_tool_reads_whatever_a_foreign_publisher_sent(
    stream_topology: BrokerSettings, tmp_path: Path
) -> None:
    settings_ = stream_topology
    totals = Totals()

    @settings(
        max_examples=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(batch=batches)
    def example(batch: Batch) -> None:
        totals.audit += publish_foreign(settings_, batch)
        reports: list[DeliveryReport] = []
        store = SqliteDedupStore(tmp_path / "dedup.sqlite3")
        try:
            Consumer(
                settings_,
                lab_handler,
                store,
                consumer_config(prefetch=5, idle_exit=0.5),
                on_report=reports.append,
            ).run()
        finally:
            store.close()
        assert ready_count(settings_, NAMES.queue) == 0  # every message had an outcome
        for report in reports:
            assert len(report.line().splitlines()) == 1
        held = depth(settings_, NAMES.dlq)
        entries = browse(settings_, NAMES.dlq)
        assert len(entries) == held
        check_entries(entries)
        check_console(settings_, tmp_path, entries)
        probe = probe_queues(settings_, NAMES)
        assert probe.ok, probe
        assert probe.dlq_oldest_age is None or probe.dlq_oldest_age >= 0
        keys = dlq_keys(settings_, NAMES.dlq)
        assert len(keys.keys) + keys.unkeyed == held
        dry = replay(settings_, lambda e: True, queue=NAMES.dlq, dry_run=True)
        assert len(dry) == held and {r.status for r in dry} <= {"would-replay", "failed"}
        read: list[StreamEntry] = []
        reading = StreamReader(settings_, AUDIT).read(read.append, "first", idle_timeout=0.5)
        assert (reading.read, reading.skipped) == (totals.audit, [])
        audit_keys = queue_keys(settings_, AUDIT)
        assert len(audit_keys.keys) + audit_keys.unkeyed == totals.audit

    example()
    run_every_script(settings_, tmp_path, totals.audit)


def run_every_script(settings: BrokerSettings, tmp_path: Path, audit: int) -> None:
    """The scripts over everything the examples left: exit codes, one line per event, strict
    JSON, no traceback."""
    held = depth(settings, NAMES.dlq)

    def script(*args: str, codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        result = run_script(settings, *args)
        assert result.returncode in codes, (args, result.stdout[-3000:], result.stderr[-3000:])
        assert "Traceback" not in result.stderr and "unexpected" not in result.stderr, args
        return result

    table = script("dlq.py")
    assert len(table.stdout.splitlines()) == held + 2  # heading, one line each, total
    rows = strict_json_lines(script("dlq.py", "--json").stdout)
    assert len(rows) == held
    summary = script("dlq.py", "--summary").stdout.splitlines()
    assert sum(int(line.split()[0]) for line in summary[1:]) == held
    alert = script("dlq.py", "--alert-age", "0", codes=(0, 2)).stdout
    assert len(alert.splitlines()) == 1
    entries = strict_json_lines(
        script("audit.py", "read", "--from", "first", "--json", "--idle-exit", "1").stdout
    )
    assert len(entries) == audit
    text = script("audit.py", "read", "--from", "first", "--idle-exit", "1")
    assert len(text.stdout.splitlines()) == audit and "skipped" not in text.stderr
    report = strict_json(
        script("keys.py", "report", "--dlq", "--offline", "--json", codes=(0, 2)).stdout
    )
    assert report["messages"] + report["unkeyed"] == held
    script("keys.py", "report", "--audit", "--offline", codes=(0, 2))
    scrape_the_exporter(settings)
    dry = script("replay.py", "--all", "--dry-run", codes=(0, 1))
    assert len(dry.stdout.splitlines()) == held + 1  # one line each, and the total
    done = script("replay.py", "--all", "--audit-log", str(tmp_path / "replay.jsonl"), codes=(0, 1))
    lines = done.stdout.splitlines()
    assert len(lines) == held + 1
    failed = sum(" status=failed" in line for line in lines)
    wait_for(lambda: ready_count(settings, NAMES.dlq) == failed, what="the failed replays kept")
    assert len(strict_json_lines((tmp_path / "replay.jsonl").read_text())) == held


def scrape_the_exporter(settings: BrokerSettings) -> None:
    """exporter.py serves, answers one scrape with probe success 1, and stops on SIGTERM."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "exporter.py"), "--port", "0"],
        env=script_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        url = line.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://"), line
        metrics = httpx.get(url, timeout=20).text
        assert f'amqp_lab_queue_probe_success{{vhost="{settings.vhost}"}} 1.0' in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "Traceback" not in err
