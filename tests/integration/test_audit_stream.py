"""The audit log as a stream: reading from first / last / a timestamp, resuming after a clean
stop and after a crash, retention bounding the stream, and the gap a resumed reader reports."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pika
import pytest

from amqp_lab.audit import OffsetStore, StreamEntry, StreamReader
from amqp_lab.errors import PublishFailed
from amqp_lab.message import OutgoingMessage
from amqp_lab.publishing.blocking import Publisher, PublishRetry
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, verify_topology, with_stream_audit
from amqp_lab.wire import AmqpProperties
from tests.brokers import TestBroker
from tests.support import NAMES, ROOT, one_error_line, run_script, strict_json, wait_for

pytestmark = pytest.mark.integration
AUDIT = "q:tasks:audit"


def apply_stream(settings: BrokerSettings, **retention: object) -> None:
    topology = with_stream_audit(load_topology(), **retention)  # type: ignore[arg-type]
    apply_topology(settings, topology)
    assert verify_topology(settings, topology) == []


def publish(settings: BrokerSettings, first: int, count: int, size: int = 20) -> None:
    with Publisher(settings) as publisher:
        for n in range(first, first + count):
            body = json.dumps({"n": n, "pad": "x" * size}).encode()
            publisher.publish(
                OutgoingMessage(
                    body, f"m-{n}", exchange=NAMES.exchange, routing_key=NAMES.routing_key
                )
            )


def read(reader: StreamReader, start: object = "first", **kw: object) -> list[StreamEntry]:
    entries: list[StreamEntry] = []
    reader.read(entries.append, start, idle_timeout=1.0, **kw)  # type: ignore[arg-type]
    return entries


def ids(entries: list[StreamEntry]) -> list[str | None]:
    return [e.message_id for e in entries]


def test_read_from_first_last_and_a_timestamp(vhost: BrokerSettings) -> None:
    apply_stream(vhost, max_length_bytes=10_000_000)
    publish(vhost, 0, 10)
    start = int(time.time()) + 1
    wait_for(lambda: time.time() >= start, timeout=3, interval=0.05, what="the next second")
    publish(vhost, 10, 10)
    reader = StreamReader(vhost, AUDIT, prefetch=7)
    everything = read(reader)
    assert ids(everything) == [f"m-{n}" for n in range(20)]
    assert [e.offset for e in everything] == sorted(e.offset for e in everything)
    assert everything[0].routing_key == NAMES.routing_key and everything[0].timestamp is not None
    assert ids(read(reader, "last"))[-1] == "m-19"
    since = ids(read(reader, datetime.fromtimestamp(start, UTC)))
    # chunk granularity: the broker may start a little before the timestamp, never after it
    assert since[-10:] == [f"m-{n}" for n in range(10, 20)]
    assert since == ids(everything)[-len(since) :]
    assert read(reader, "next") == []


def test_resume_after_a_clean_stop_and_after_a_crash(vhost: BrokerSettings, tmp_path: Path) -> None:
    apply_stream(vhost, max_length_bytes=10_000_000)
    publish(vhost, 0, 20)
    offsets = tmp_path / "offsets.json"
    clean = StreamReader(vhost, AUDIT, prefetch=4, store=OffsetStore(offsets), name="clean")
    first_half = read(clean, limit=10)
    second_half = read(clean, "last")  # --from is ignored when an offset is stored
    assert ids(first_half + second_half) == [f"m-{n}" for n in range(20)]  # re-read: 0
    assert clean.stored_offset() == second_half[-1].offset

    # A crash: the process dies after processing 13 entries; stores happen every 5 entries.
    crash = f"""
import os
from amqp_lab.audit import OffsetStore, StreamReader
from amqp_lab.settings import BrokerSettings
seen = []
def on_entry(entry):
    seen.append(entry)
    print(entry.offset, flush=True)
    if len(seen) == 13:
        os._exit(9)
reader = StreamReader(BrokerSettings({vhost.amqp_url!r}), {AUDIT!r}, prefetch=4,
                      store=OffsetStore({str(offsets)!r}), name="crashy", store_every=5)
reader.read(on_entry, "first", idle_timeout=5)
"""
    done = subprocess.run(
        [sys.executable, "-c", crash], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert done.returncode == 9, done.stderr
    processed = [int(line) for line in done.stdout.split()]
    assert len(processed) == 13
    crashy = StreamReader(vhost, AUDIT, prefetch=4, store=OffsetStore(offsets), name="crashy")
    assert crashy.stored_offset() == processed[9]  # the 10th entry: the last store
    resumed = read(crashy)
    reread = [e.offset for e in resumed if e.offset in processed]
    assert reread == processed[10:]  # the unstored tail is read again: at-least-once
    assert sorted(set(processed) | {e.offset for e in resumed}) == [
        e.offset for e in first_half + second_half
    ]


def test_retention_bounds_the_stream_and_a_late_reader_sees_the_gap(
    vhost: BrokerSettings, broker: TestBroker, tmp_path: Path
) -> None:
    max_bytes, segment = 20_000, 5_000
    apply_stream(vhost, max_length_bytes=max_bytes, max_segment_size_bytes=segment)
    store = OffsetStore(tmp_path / "offsets.json")
    late = StreamReader(vhost, AUDIT, prefetch=10, store=store, name="late")
    publish(vhost, 0, 5, size=1000)
    assert len(read(late, limit=3)) == 3
    stored = late.stored_offset()
    assert stored is not None
    count, size = 200, 1000
    publish(vhost, 5, count - 5, size=size)
    published_bytes = count * (size + 20)

    def kept() -> list[StreamEntry]:
        entries = read(StreamReader(vhost, AUDIT, prefetch=50))
        return entries if entries and entries[-1].message_id == f"m-{count - 1}" else []

    entries = wait_for(kept, timeout=15, what="the whole stream readable")
    kept_bytes = sum(len(e.body) for e in entries)
    print(
        f"retention: published {count} messages / {published_bytes} body bytes; kept "
        f"{len(entries)} messages / {kept_bytes} body bytes (first offset {entries[0].offset}); "
        f"bound max-length-bytes {max_bytes} + segment {segment}"
    )
    assert kept_bytes <= max_bytes + 2 * segment
    assert len(entries) < count / 4
    disk = _stream_dir_bytes(broker)
    if disk is not None:
        print(f"retention: stream directory on disk {disk} bytes")
        assert disk <= max_bytes + 3 * segment  # segments plus their index files

    gap: list[StreamEntry] = []
    report = late.read(gap.append, idle_timeout=1.0)
    assert report.resumed_from == stored
    assert report.removed == entries[0].offset - (stored + 1) > 0
    assert report.gap is not None and "removed by retention before they were read" in report.gap
    assert ids(gap) == ids(entries)


def _stream_dir_bytes(broker: TestBroker) -> int | None:
    """On-disk bytes of the stream directories of the dedicated local node (None elsewhere:
    a container's data dir is not reachable from here)."""
    if broker.kind != "dedicated node":
        return None
    dirs = list((ROOT / ".broker" / "test-node" / "data").glob("*/stream/*q:tasks:audit*"))
    dirs += list((ROOT / ".broker" / "test-node" / "data").glob("*/stream/*audit*"))
    if not dirs:
        return None
    newest = max(dirs, key=lambda d: d.stat().st_mtime)
    return sum(f.stat().st_size for f in newest.iterdir() if f.is_file())


def test_the_script_reads_resumes_and_fails_in_one_line(
    vhost: BrokerSettings, tmp_path: Path
) -> None:
    apply_stream(vhost, max_length_bytes=10_000_000)
    publish(vhost, 0, 6)
    common = ("--resume", "cli", "--offsets-file", str(tmp_path / "o.json"), "--idle-exit", "1")
    first = run_script(
        vhost, "audit.py", "read", "--from", "first", "--limit", "4", "--json", *common
    )
    assert first.returncode == 0, first.stderr
    rest = run_script(vhost, "audit.py", "read", "--json", *common)
    assert rest.returncode == 0, rest.stderr
    rows = [strict_json(line) for line in (first.stdout + rest.stdout).splitlines()]
    assert [r["message_id"] for r in rows] == [f"m-{n}" for n in range(6)]
    info = run_script(vhost, "audit.py", "info")
    assert info.returncode == 0 and "type stream" in info.stdout, info.stderr
    missing = run_script(vhost, "audit.py", "--stream", "nope", "read")
    assert missing.returncode == 1
    assert "stream 'nope' does not exist" in one_error_line(missing.stderr)
    classic = run_script(vhost, "audit.py", "--stream", "q:tasks", "read")
    assert classic.returncode == 1
    assert "cannot be read as a stream" in one_error_line(classic.stderr)


@pytest.mark.parametrize(
    ("fields", "refused_from"),
    [({"headers": {"amount": Decimal("1.50")}}, (3, 10)), ({"reply_to": b"\xff"}, (4, 3))],
    ids=["decimal-header", "reply_to-not-utf8"],
)
def test_what_a_stream_refuses_on_its_way_in(
    vhost: BrokerSettings,
    broker: TestBroker,
    fields: dict[str, Any],
    refused_from: tuple[int, int],
) -> None:
    """Two legal messages a classic queue takes and a stream does not: RabbitMQ closes the
    publisher's connection (541 INTERNAL_ERROR, no confirm) for a decimal header (3.10, 4.0,
    4.3) and for a reply_to that is not UTF-8 (4.3), whether published to the stream or to an
    exchange that routes a copy there (docs/audit-stream.md)."""
    apply_stream(vhost, max_length_bytes=10_000_000)
    outcomes = []
    for target in (("", NAMES.dlq), ("", AUDIT), (NAMES.exchange, NAMES.routing_key)):
        connection = pika.BlockingConnection(pika.URLParameters(vhost.amqp_url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish(*target, b"{}", AmqpProperties(**fields), mandatory=True)
            outcomes.append("confirmed")
        except pika.exceptions.ConnectionClosedByBroker as e:
            outcomes.append(f"closed {e.reply_code}")
        finally:
            if connection.is_open:
                connection.close()
    major, minor = (int(part) for part in broker.version.split(".")[:2])
    refused = (major, minor) >= refused_from
    stream = "closed 541" if refused else "confirmed"
    assert outcomes == ["confirmed", stream, stream]  # the DLQ is a classic queue
    if refused:  # amqp-lab's publisher: retried on a new connection, then a clear failure
        message = OutgoingMessage(
            b"{}", "m-1", exchange=NAMES.exchange, routing_key=NAMES.routing_key, **fields
        )
        retry = PublishRetry(max_attempts=2, base=0.01)
        with Publisher(vhost, retry) as publisher, pytest.raises(PublishFailed, match="541"):
            publisher.publish(message)


def test_legal_values_a_foreign_publisher_sent_are_read_and_the_reader_goes_on(
    vhost: BrokerSettings, tmp_path: Path
) -> None:
    """A timestamp past year 9999 stopped the reader for good (ValueError, at the same offset
    on every resume); a message_id that is not UTF-8, or holds a newline, broke or forged
    audit.py's lines."""
    apply_stream(vhost, max_length_bytes=10_000_000)
    sent: list[dict[str, Any]] = [
        {"message_id": "m-1", "timestamp": 253402300800},  # year 10000
        {"message_id": b"m-\xff", "timestamp": 2**40},
        {"message_id": "m-3\nforged 4 m-4", "headers": {"x": "a\u2028b"}},
    ]
    connection = pika.BlockingConnection(pika.URLParameters(vhost.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for fields in sent:
            channel.basic_publish("", AUDIT, b"line 1\nline 2", AmqpProperties(**fields))
    finally:
        connection.close()
    common = ("--resume", "r", "--offsets-file", str(tmp_path / "o.json"), "--idle-exit", "1")
    text = run_script(vhost, "audit.py", "read", "--from", "first", *common)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 3 and "3 entries read" in text.stderr, text.stdout + text.stderr
    assert "m-1" in lines[0] and "253402300800" in lines[0]
    assert "m-\\xff" in lines[1] and "m-3\\nforged 4 m-4" in lines[2]
    again = run_script(vhost, "audit.py", "read", *common)  # resumes after the last one
    assert (again.returncode, again.stdout) == (0, ""), again.stderr
    rows = [
        strict_json(line)
        for line in run_script(
            vhost, "audit.py", "read", "--from", "first", "--json", "--idle-exit", "1"
        ).stdout.splitlines()
    ]
    assert [r["message_id"] for r in rows] == ["m-1", None, "m-3\nforged 4 m-4"]
    assert rows[0]["timestamp"] is None
    assert ["timestamp", {"l": 253402300800}] in rows[0]["properties"]
    assert ["message_id", {"x": "bS3/"}] in rows[1]["properties"]  # the exact bytes
    assert ["x", {"S": "a\u2028b"}] in rows[2]["headers"]
    assert {r["body"] for r in rows} == {"line 1\nline 2"}


def test_an_entry_the_reader_cannot_make_is_skipped_with_its_reason(
    vhost: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No legal value is known to need it (every one is read): should one appear, it costs
    one entry, reported with its offset and reason, never the reader's end."""
    from amqp_lab.audit import reader as module

    apply_stream(vhost, max_length_bytes=10_000_000)
    publish(vhost, 0, 3)
    make = module._entry

    def fragile(offset: int, method: Any, properties: Any, body: bytes) -> StreamEntry:
        if properties.message_id == "m-1":
            raise RuntimeError("boom")
        return make(offset, method, properties, body)

    monkeypatch.setattr(module, "_entry", fragile)
    store = OffsetStore(tmp_path / "o.json")
    reader = StreamReader(vhost, AUDIT, store=store, name="r")
    entries: list[StreamEntry] = []
    report = reader.read(entries.append, "first", idle_timeout=1.0)
    assert ids(entries) == ["m-0", "m-2"]
    ((offset, reason),) = report.skipped
    assert reason == "RuntimeError: boom" and entries[0].offset < offset < entries[1].offset
    assert (report.read, reader.stored_offset()) == (2, entries[1].offset)
