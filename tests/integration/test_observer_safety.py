"""Watching never changes the work: an observer that raises on every call leaves settlement and
publishing as they were; the unacked gauge counts what the broker has handed over and not
settled (in a handler, collected, or held by pika)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.exporters.metrics import ConsumerMetrics
from amqp_lab.message import Task
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from tests.support import NAMES, consumer_config, lab_message, ready_count, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


class Broken:
    """An observer whose every method raises."""

    calls = 0

    def __getattr__(self, name: str) -> Any:
        def boom(*args: Any, **kwargs: Any) -> None:
            Broken.calls += 1
            raise RuntimeError(f"observer bug in {name}")

        return boom


def test_a_raising_observer_changes_nothing(topology: BrokerSettings, tmp_path: Path) -> None:
    Broken.calls = 0
    with Publisher(topology, observer=Broken()) as publisher:
        for n in range(3):
            publisher.publish(lab_message(body=b"{}", message_id=f"w-{n}"))
        assert publisher.attempts_made == 3  # each confirmed once: none published again
    assert ready_count(topology, NAMES.queue) == 3
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(str(tmp_path / "dedup.sqlite3"))
    config = consumer_config(idle_exit=1.0)
    try:
        consumer = Consumer(
            topology,
            lambda task, db: None,
            store,
            config,
            on_report=reports.append,
            observer=Broken(),
        )
        assert consumer.run() == 3
    finally:
        store.close()
    assert sorted((r.message_id, r.outcome) for r in reports) == [
        ("w-0", "processed"),
        ("w-1", "processed"),
        ("w-2", "processed"),
    ]
    assert ready_count(topology, NAMES.queue) == 0
    assert Broken.calls > 10  # it was called, and raised, all along


def test_the_unacked_gauge_counts_what_the_broker_handed_over(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    with Publisher(topology) as publisher:
        for n in range(5):
            publisher.publish(lab_message(body=b"{}", message_id=f"u-{n}"))
    registry = CollectorRegistry()
    metrics = ConsumerMetrics(topology.vhost, NAMES.queue, registry)
    release = threading.Event()

    def first_waits(task: Task, db: Any) -> None:
        if task.message_id == "u-0":
            assert release.wait(30)

    store = SqliteDedupStore(str(tmp_path / "dedup.sqlite3"))
    config = consumer_config(idle_exit=1.0, prefetch=10, concurrency=1)
    consumer = Consumer(topology, first_waits, store, config, observer=metrics)
    worker = threading.Thread(target=consumer.run)
    worker.start()
    labels = {"vhost": topology.vhost, "queue": NAMES.queue}

    def unacked() -> float:
        return registry.get_sample_value("amqp_lab_consumer_unacked_deliveries", labels) or 0.0

    try:
        # u-0 in the handler, u-1..u-4 prefetched: the broker counts 5 unacked, so do we
        wait_for(lambda: unacked() == 5, timeout=20, what=f"5 unacked (now {unacked()})")
    finally:
        release.set()
        worker.join(30)
        store.close()
    assert unacked() == 0
    assert registry.get_sample_value("amqp_lab_consumer_processed_total", labels) == 5
