"""The queue-side exporter (scripts/exporter.py, amqp_lab.exporters.queues) scraped over
HTTP as Prometheus would: exact depths and consumer counts, the DLQ head's age, a DLQ left as
it was (depth and order) however often it is scraped, and probe failure instead of an error
when the broker, the vhost or a queue is missing."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from amqp_lab.connection import open_channel
from amqp_lab.dlq.ops import browse
from amqp_lab.dlq.record import build_record, record_message
from amqp_lab.errors import BusinessError
from amqp_lab.message import OutgoingMessage, encode_json
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from tests.support import NAMES, ROOT, ready_count, script_env, wait_ready_count

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@contextmanager
def exporter(settings: BrokerSettings, *args: str) -> Iterator[str]:
    """Run scripts/exporter.py on a free port; yield its /metrics URL; SIGTERM it, exit 0."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "exporter.py"), "--port", "0", *args],
        env=script_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert "serving queue metrics" in first, first + process.stderr.read()
        yield first.split(" on ", 1)[1].strip()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    if settings.password != settings.username:  # the test broker's guest:guest
        assert settings.password not in stderr, stderr


def scrape(url: str) -> Samples:
    """GET /metrics and parse it: {(sample name, labels): value}."""
    response = httpx.get(url, timeout=20)
    assert response.status_code == 200, response.text
    assert "_created" not in response.text  # issue 23: no _created series
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def fill_dlq(settings: BrokerSettings, *records: tuple[str, float]) -> None:
    """DLQ records (message_id, failed_at in seconds since the epoch), in this order."""
    with Publisher(settings) as publisher:
        for seq, (message_id, failed_at) in enumerate(records):
            record = build_record(
                body=encode_json({"kind": "ok", "seq": seq}),
                message_id=message_id,
                exchange=NAMES.exchange,
                routing_key=NAMES.routing_key,
                queue=NAMES.queue,
                properties={"content_type": "application/json"},
                headers={"attempts": 0},
                error=BusinessError("no customer"),
                classification="business",
                attempts=1,
                first_seen_at="2026-01-01T00:00:00.000Z",
                failed_at=failed_at,
            )
            publisher.publish(record_message(record, NAMES.dead_letter_exchange, "task"))


def test_dlq_depth_and_oldest_age_and_the_dlq_is_left_as_it_was(topology: BrokerSettings) -> None:
    now = time.time()
    fill_dlq(topology, ("m-old", now - 120), ("m-new", now - 60))
    wait_ready_count(topology, NAMES.dlq, 2)
    with exporter(topology) as url:
        for _ in range(3):
            samples = scrape(url)
            # back already: the head was nacked (requeue) before the scrape's connection closed
            assert ready_count(topology, NAMES.dlq) == 2
            vhost = topology.vhost
            assert value(samples, "amqp_lab_queue_messages", vhost=vhost, queue=NAMES.dlq) == 2
            assert value(samples, "amqp_lab_queue_messages", vhost=vhost, queue=NAMES.queue) == 0
            age = value(
                samples, "amqp_lab_dlq_oldest_record_age_seconds", vhost=vhost, queue=NAMES.dlq
            )
            assert age is not None and 119 <= age <= 120 + (time.time() - now) + 1
            assert value(samples, "amqp_lab_queue_probe_success", vhost=vhost) == 1
            # the wait queues the topology names exist, and are exported too
            wait = NAMES.wait_queue(1)
            assert value(samples, "amqp_lab_queue_messages", vhost=vhost, queue=wait) == 0
    # nothing consumed, nothing left unacked, the order kept
    wait_ready_count(topology, NAMES.dlq, 2)
    assert [entry.message_id for entry in browse(topology, NAMES.dlq)] == ["m-old", "m-new"]


def test_an_empty_dlq_is_age_zero_and_a_head_without_time_has_no_age(
    topology: BrokerSettings,
) -> None:
    with exporter(topology) as url:
        samples = scrape(url)
        labels = {"vhost": topology.vhost, "queue": NAMES.dlq}
        assert value(samples, "amqp_lab_dlq_oldest_record_age_seconds", **labels) == 0
        # a raw message (no record, no x-death): nothing says when it failed
        with Publisher(topology) as publisher:
            publisher.publish(
                OutgoingMessage(body=b"raw", message_id="raw-1", exchange="", routing_key=NAMES.dlq)
            )
        wait_ready_count(topology, NAMES.dlq, 1)
        samples = scrape(url)
        assert value(samples, "amqp_lab_queue_messages", **labels) == 1
        assert value(samples, "amqp_lab_dlq_oldest_record_age_seconds", **labels) is None
        assert value(samples, "amqp_lab_queue_probe_success", vhost=topology.vhost) == 1
    wait_ready_count(topology, NAMES.dlq, 1)


def test_consumers_are_counted(topology: BrokerSettings) -> None:
    with exporter(topology) as url:
        labels = {"vhost": topology.vhost, "queue": NAMES.queue}
        assert value(scrape(url), "amqp_lab_queue_consumers", **labels) == 0
        with open_channel(topology) as channel:
            channel.basic_consume(NAMES.queue, lambda *a: None)
            assert value(scrape(url), "amqp_lab_queue_consumers", **labels) == 1
        dlq = {"vhost": topology.vhost, "queue": NAMES.dlq}
        assert value(scrape(url), "amqp_lab_queue_consumers", **dlq) == 0


def test_a_missing_queue_is_probe_failure_with_a_log_line(vhost: BrokerSettings) -> None:
    with exporter(vhost) as url:
        samples = scrape(url)
    assert value(samples, "amqp_lab_queue_probe_success", vhost=vhost.vhost) == 0
    assert not [key for key in samples if key[0] == "amqp_lab_queue_messages"]


def test_missing_queue_names_the_queue_on_stderr(vhost: BrokerSettings) -> None:
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "exporter.py"), "--port", "0"],
        env=script_env(vhost),
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    url = process.stderr.readline().split(" on ", 1)[1].strip()
    scrape(url)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert f"queue {NAMES.queue!r} not found in vhost {vhost.vhost!r}" in stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("where", ["no broker", "no vhost", "wrong password"])
def test_an_unreachable_broker_is_probe_failure_not_an_error(
    topology: BrokerSettings, where: str
) -> None:
    url = topology.amqp_url
    if where == "no broker":
        url = url.replace(f":{topology.port}/", f":{free_port()}/")
    elif where == "no vhost":
        url = url.rsplit("/", 1)[0] + "/no-such-vhost"
    else:
        url = url.replace(f":{topology.password}@", ":not-the-password@")
    settings = BrokerSettings(url, topology.management_url)
    with exporter(settings) as metrics:
        for _ in range(2):
            samples = scrape(metrics)
            assert value(samples, "amqp_lab_queue_probe_success", vhost=settings.vhost) == 0
            assert [key[0] for key in samples] == ["amqp_lab_queue_probe_success"]
