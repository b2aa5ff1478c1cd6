"""Scenario S4 (pika #764): a broker memory alarm ends a publish in a typed error, not a hang;
consumers keep consuming; after the alarm the retried message is processed exactly once."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from amqp_lab.errors import BrokerBlocked
from amqp_lab.exporters.metrics import PublisherMetrics
from amqp_lab.publishing.blocking import Publisher, PublishRetry
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message
from tests.brokers import TestBroker
from tests.support import get_all, lines_for, run_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]
WATERMARK = str(512 * 1024 * 1024)


def mem_alarm(broker: TestBroker) -> bool:
    with broker.admin() as api:
        return bool(api.nodes()[0].get("mem_alarm"))


@contextmanager
def memory_alarm(broker: TestBroker) -> Iterator[None]:
    """Raise the memory alarm by lowering the watermark at runtime; always restore it."""
    if broker.ctl_fn is None:
        pytest.skip("the broker came from EAI_AMQP_URL: the tests cannot change its watermark")
    broker.ctl("set_vm_memory_high_watermark", "absolute", "10000000")
    try:
        wait_for(lambda: mem_alarm(broker), what="memory alarm raised")
        yield
    finally:
        broker.ctl("set_vm_memory_high_watermark", "absolute", WATERMARK)
        wait_for(lambda: not mem_alarm(broker), what="memory alarm cleared")


def test_blocked_publish_fails_typed_then_retry_is_processed_once(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    settings = BrokerSettings(
        topology.amqp_url, topology.management_url, blocked_connection_timeout=3
    )
    message = task_message("ok", 1, "during-alarm")
    registry = CollectorRegistry()
    metrics = PublisherMetrics(topology.vhost, registry)
    retry = PublishRetry(max_attempts=3)
    with memory_alarm(broker), Publisher(settings, retry, observer=metrics) as publisher:
        started = time.monotonic()
        with pytest.raises(BrokerBlocked):
            publisher.publish(message)
        elapsed = time.monotonic() - started
        assert 2.5 <= elapsed < 15, elapsed
        assert publisher.attempts_made == 1  # a blocked broker is not hammered with retries
    # the operator sees it: the seconds blocked and a failed outcome
    vhost = {"vhost": topology.vhost}
    blocked = registry.get_sample_value("amqp_lab_publisher_blocked_seconds_total", vhost)
    assert blocked is not None and 2.0 <= blocked <= elapsed + 0.5, (blocked, elapsed)
    labels = {**vhost, "exchange": message.exchange, "outcome": "failed"}
    assert registry.get_sample_value("amqp_lab_publisher_published_total", labels) == 1
    with Publisher(settings) as publisher:
        publisher.publish(message)  # the caller's retry once the alarm has cleared
    rows = run_worker(topology, tmp_path)
    outcomes = [outcome for outcome, _, _ in lines_for(rows, "during-alarm")]
    assert outcomes.count("processed") == 1
    assert set(outcomes) <= {"processed", "duplicate"}  # a copy sent while blocked is absorbed
    with sqlite3.connect(tmp_path / "dedup.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM effects").fetchone() == (1,)


def test_consumers_keep_consuming_during_the_alarm(
    broker: TestBroker, topology: BrokerSettings
) -> None:
    with Publisher(topology) as publisher:
        publisher.publish(task_message("ok", 1, "before-alarm"))
    with memory_alarm(broker):
        consumed = get_all(topology, "q:tasks")
        assert [p.message_id for _, p, _ in consumed] == ["before-alarm"]
    with Publisher(topology) as publisher:
        publisher.publish(task_message("ok", 2, "after-alarm"))
    assert [p.message_id for _, p, _ in get_all(topology, "q:tasks")] == ["after-alarm"]
