"""A publisher's metrics on a real broker: each outcome counted once, confirm latency observed
per confirmed message, and a long-running publish.py serving /metrics while it publishes."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from amqp_lab.errors import MessageUnroutable, NotFound
from amqp_lab.exporters.metrics import PublisherMetrics
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from tests.support import lab_message, start_script, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def outcome(registry: CollectorRegistry, vhost: str, exchange: str, name: str) -> float:
    labels = {"vhost": vhost, "exchange": exchange, "outcome": name}
    return registry.get_sample_value("amqp_lab_publisher_published_total", labels) or 0.0


@pytest.mark.parametrize("pipelined", [False, True], ids=["blocking", "pipelined"])
def test_each_publish_outcome_is_counted_once(topology: BrokerSettings, pipelined: bool) -> None:
    registry = CollectorRegistry()
    metrics = PublisherMetrics(topology.vhost, registry)
    good = [lab_message(body=b"{}", message_id=f"m-{n}") for n in range(3)]
    lost = dataclasses.replace(good[0], message_id="nowhere", routing_key="nowhere")
    if pipelined:
        with PipelinedPublisher(topology, observer=metrics) as publisher:
            batch = publisher.publish_many([*good, lost]).wait(30)
        assert len(batch.failures) == 1 and isinstance(batch.failures[0][1], MessageUnroutable)
    else:
        with Publisher(topology, observer=metrics) as publisher:
            for message in good:
                publisher.publish(message)
            with pytest.raises(MessageUnroutable):
                publisher.publish(lost)
            missing = dataclasses.replace(good[0], exchange="no-such-exchange")
            with pytest.raises(NotFound):
                publisher.publish(missing)
            assert outcome(registry, topology.vhost, "no-such-exchange", "failed") == 1
    assert outcome(registry, topology.vhost, "tasks", "confirmed") == 3
    assert outcome(registry, topology.vhost, "tasks", "unroutable") == 1
    confirms = registry.get_sample_value(
        "amqp_lab_publisher_confirm_duration_seconds_count",
        {"vhost": topology.vhost, "exchange": "tasks"},
    )
    # the unroutable message is acked too (after its basic.return): only the 3 count as
    # confirmed outcomes, but the blocking publisher times every confirm it waited for
    assert confirms is not None and confirms >= 3


def test_a_long_running_publish_serves_metrics(topology: BrokerSettings) -> None:
    publisher = start_script(
        topology, "publish.py", "--count", "150", "--rate", "50", "--metrics-port", "0"
    )
    try:
        assert publisher.stderr is not None
        line = publisher.stderr.readline().strip()
        assert line.startswith("metrics on http://127.0.0.1:"), line
        url = line.split(" ")[-1]

        def confirmed() -> float:
            text = httpx.get(url, timeout=5).text
            assert "_created" not in text  # issue 23: prometheus-client's _created series are off
            return sum(
                s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name == "amqp_lab_publisher_published_total"
                and s.labels.get("outcome") == "confirmed"
            )

        first = wait_for(lambda: confirmed() >= 10, timeout=30, what="10 confirmed") and confirmed()
        later = wait_for(lambda: confirmed() > first + 20, timeout=30, what="counter moving")
        assert later
    finally:
        out, err = publisher.communicate(timeout=60)
    assert publisher.returncode == 0, err
    assert out.count("status=confirmed") == 150
