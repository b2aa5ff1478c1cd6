"""The queue exporter's pure part and its scrape deadline, without a broker."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from amqp_lab.exporters import queues
from amqp_lab.exporters.queues import QueueCollector, QueueProbe, QueueState, metric_families
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import load_topology

pytestmark = pytest.mark.unit

NAMES = load_topology().names
SETTINGS = BrokerSettings("amqp://u:secret@127.0.0.1:1/vh")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metric_families_of_a_probe() -> None:
    probe = QueueProbe(
        "vh", "q:dlq", queues=[QueueState("q", 3, 1), QueueState("q:dlq", 2, 0)], dlq_oldest_age=9
    )
    families = {f.name: f for f in metric_families(probe)}
    assert [(s.labels, s.value) for s in families["amqp_lab_queue_messages"].samples] == [
        ({"vhost": "vh", "queue": "q"}, 3),
        ({"vhost": "vh", "queue": "q:dlq"}, 2),
    ]
    assert [s.value for s in families["amqp_lab_queue_consumers"].samples] == [1, 0]
    age = families["amqp_lab_dlq_oldest_record_age_seconds"].samples
    assert [(s.labels, s.value) for s in age] == [({"vhost": "vh", "queue": "q:dlq"}, 9)]
    assert [s.value for s in families["amqp_lab_queue_probe_success"].samples] == [1]


def test_unknown_age_is_absent_and_failure_is_zero() -> None:
    families = {f.name: f for f in metric_families(QueueProbe("vh", "q:dlq", ok=False))}
    assert families["amqp_lab_dlq_oldest_record_age_seconds"].samples == []
    assert [s.value for s in families["amqp_lab_queue_probe_success"].samples] == [0]


def test_registering_contacts_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> QueueProbe:
        raise AssertionError("probed at registration")

    monkeypatch.setattr(queues, "probe_queues", refuse)
    CollectorRegistry().register(QueueCollector(SETTINGS, NAMES))


def test_a_slow_broker_is_probe_failure_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hang(*args: object) -> QueueProbe:
        release.wait(10)
        return QueueProbe("vh", NAMES.dlq)

    monkeypatch.setattr(queues, "probe_queues", hang)
    registry = CollectorRegistry()
    registry.register(QueueCollector(SETTINGS, NAMES, timeout=0.1))
    try:
        found = samples(generate_latest(registry).decode())
    finally:
        release.set()
    assert found == {("amqp_lab_queue_probe_success", (("vhost", "vh"),)): 0}


def test_no_broker_is_probe_failure_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    registry.register(QueueCollector(SETTINGS, NAMES, timeout=10))
    found = samples(generate_latest(registry).decode())
    assert found == {("amqp_lab_queue_probe_success", (("vhost", "vh"),)): 0}
    assert "queue probe of vhost 'vh' failed" in caplog.text
    assert "secret" not in caplog.text
