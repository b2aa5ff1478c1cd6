"""The test broker runs with our rabbitmq.conf."""

from __future__ import annotations

import pytest

from tests.brokers import TestBroker
from tests.support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.foundation]

MIB = 1024 * 1024


def test_memory_limit_is_absolute_512_mib(broker: TestBroker) -> None:
    """vm_memory_high_watermark.absolute = 512MiB, read back from /api/nodes mem_limit."""
    with broker.admin() as api:
        nodes = wait_for(
            lambda: [n for n in api.nodes() if n.get("mem_limit")], what="mem_limit in /api/nodes"
        )
    assert [n["mem_limit"] for n in nodes] == [512 * MIB]
