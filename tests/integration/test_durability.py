"""Durable queue + persistent messages survive a real broker restart; transient ones do not."""

from __future__ import annotations

import pytest

from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import load_topology, verify_topology
from lab.durability import run_restart_demo
from tests.brokers import TestBroker
from tests.support import run_script

pytestmark = [pytest.mark.integration, pytest.mark.restart, pytest.mark.foundation]


def test_persistent_messages_survive_restart(broker: TestBroker, topology: BrokerSettings) -> None:
    """Scenario S11; and the topology verifies clean right after the restart (the management
    statistics that show effective policies are empty for a few seconds after a boot)."""
    vhost = topology
    if broker.restart_fn is None:
        pytest.skip("the broker came from EAI_AMQP_URL: the tests cannot restart it")

    def restart() -> BrokerSettings:
        broker.restart()
        return broker.settings(vhost.vhost)  # container ports may change across a restart

    result = run_restart_demo(vhost, restart, count=20)
    assert (result.persistent_survived, result.transient_survived) == (20, 0)
    assert result.line() == "persistent survived=20/20 transient survived=0/20"
    assert verify_topology(broker.settings(vhost.vhost), load_topology()) == []


def test_restart_demo_without_a_way_to_restart_exits_4(vhost: BrokerSettings) -> None:
    result = run_script(vhost, "restart_demo.py", "--count", "1")
    assert result.returncode == 4
    assert "cannot restart the broker" in result.stdout
    assert "guest:guest" not in result.stdout
