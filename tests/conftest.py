"""Shared fixtures: one test broker per session, one fresh vhost per integration test."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from amqp_lab.settings import BrokerSettings
from tests.brokers import TestBroker, start_test_broker

# No per-example deadline: on a loaded 2-core machine (CI runs tests side by side) one slow
# example is not a failure; every test still has its pytest timeout.
settings.register_profile("amqp-lab", deadline=None)
settings.load_profile("amqp-lab")

ROOT = Path(__file__).resolve().parent.parent
_broker: TestBroker | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (``-n N --dist loadgroup``) every worker has a test broker of its
    own; tests that use something fixed beside it - the three-node cluster's container names
    and ports - run in one group, one after the other. First of the hooks: xdist reads the
    group in its own (a group added after it is none, pytest-dev/pytest-xdist#1241; two
    workers then ran test_cluster's module fixture at once, each stopping the other's
    cluster). tests/unit/test_xdist_groups.py checks that the groups hold."""
    for item in items:
        if item.get_closest_marker("cluster") or item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group("shared-docker"))


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Iterator[TestBroker]:
    """The session's RabbitMQ (see tests/brokers.py for how it is chosen)."""
    global _broker
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    _broker = start_test_broker()
    if reporter is not None:
        for note in _broker.notes:
            reporter.write_line(note, yellow=note.startswith("WARNING"), bold=True)
        reporter.write_line(f"test broker: {_broker.describe()}", bold=True)
    yield _broker
    _broker.close_fn()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _broker is not None:
        for note in _broker.notes:
            terminalreporter.write_line(note, yellow=note.startswith("WARNING"))
        terminalreporter.write_line(f"test broker used: {_broker.kind} RabbitMQ {_broker.version}")


@pytest.fixture
def vhost(broker: TestBroker, request: pytest.FixtureRequest) -> Iterator[BrokerSettings]:
    """A fresh vhost for this test, created and deleted through the management API."""
    name = (
        "t-"
        + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40]
        + "-"
        + uuid.uuid4().hex[:6]
    )
    with broker.admin() as api:
        api.create_vhost(name)
        api.set_permissions(name, broker.username)
    yield broker.settings(name)
    with broker.admin() as api:
        api.delete_vhost(name)


@pytest.fixture
def topology(vhost: BrokerSettings) -> BrokerSettings:
    """The vhost with topology/definitions.json applied."""
    from amqp_lab.topology import apply_topology, load_topology

    apply_topology(vhost, load_topology())
    return vhost
