"""A publisher whose node goes silent (no confirm, no heartbeat: a stalled link, a frozen node,
or a node on the minority side of a partition, which keeps the heartbeats going) gives the
connection up after ``confirm_timeout`` and republishes on the next node of its address list,
instead of waiting as long as the connection lives (docs/cluster.md#partitions)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from amqp_lab.publishing.blocking import Publisher
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message
from tests.faultproxy import FaultProxy
from tests.support import get_all, through, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.failure_model,
    pytest.mark.no_plain_consumer,
]


def assert_republished_once_or_twice(topology: BrokerSettings) -> None:
    """m-before once in q:tasks, m-during once or twice: republished with the same message_id
    after the timeout, and the stalled copy may reach the broker too (dedup absorbs it)."""
    seen: Counter[str] = Counter()

    def drained() -> bool:
        seen.update(p.message_id for _, p, _ in get_all(topology, "q:tasks"))
        return seen["m-during"] >= 1

    wait_for(drained, 10, what="m-during in q:tasks")
    assert seen["m-before"] == 1 and seen["m-during"] in (1, 2)


@pytest.mark.timeout(90)
def test_a_silent_node_is_given_up_after_the_confirm_timeout_and_the_next_node_confirms(
    topology: BrokerSettings,
) -> None:
    with (
        FaultProxy((topology.host, topology.port)) as first,
        FaultProxy((topology.host, topology.port)) as second,
    ):
        proxies = {first.port: first, second.port: second}
        urls = [through(topology, p.port).amqp_url for p in (first, second)]
        settings = BrokerSettings(",".join(urls), topology.management_url, heartbeat=60)
        with PipelinedPublisher(settings, window=10, confirm_timeout=1.5) as publisher:
            publisher.publish(task_message("ok", 1, "m-before"), timeout=30)
            assert publisher.address is not None
            silent = proxies[publisher.address.port]
            stall = threading.Thread(target=silent.stall, args=(20,), daemon=True)
            stall.start()  # forwards nothing for 20 s, far beyond the timeout; heartbeats: 60 s
            started = time.monotonic()
            publisher.publish(task_message("ok", 2, "m-during"), timeout=30)
            took = time.monotonic() - started
            assert publisher.address is not None and publisher.address.port != silent.port
            assert (publisher.confirms_timed_out, publisher.confirms_lost) == (1, 0)
            assert publisher.reconnects == 1 and publisher.nacks == 0
        assert 1.5 <= took < 10, took  # the timeout, a reconnect; not the stall's 20 s
        stall.join(30)
    assert_republished_once_or_twice(topology)


@pytest.mark.timeout(60)
def test_without_a_confirm_timeout_the_publisher_waits_for_the_link(
    topology: BrokerSettings,
) -> None:
    """confirm_timeout=None keeps the old behaviour: the connection lives (heartbeat 60 s), so
    the publish waits until the link flows again, on the same connection."""
    with FaultProxy((topology.host, topology.port)) as proxy:
        settings = through(topology, proxy.port, heartbeat=60)
        with PipelinedPublisher(settings, window=10, confirm_timeout=None) as publisher:
            publisher.publish(task_message("ok", 1, "m-before"), timeout=30)
            stall = threading.Thread(target=proxy.stall, args=(4,), daemon=True)
            stall.start()
            started = time.monotonic()
            publisher.publish(task_message("ok", 2, "m-during"), timeout=30)
            took = time.monotonic() - started
            assert (publisher.reconnects, publisher.confirms_timed_out) == (0, 0)
        stall.join(10)
    assert 3 <= took < 15, took


@pytest.mark.timeout(90)
def test_a_blocking_publish_whose_confirm_does_not_come_is_republished_on_another_node(
    topology: BrokerSettings,
) -> None:
    """The blocking Publisher (and the consumer's retry and DLQ writes, through the same
    confirm_deadline): a node that goes silent with the heartbeats far off is given up after
    confirm_timeout, and the publish goes again, same message_id, through the other node."""
    with (
        FaultProxy((topology.host, topology.port)) as first,
        FaultProxy((topology.host, topology.port)) as second,
    ):
        urls = [through(topology, p.port).amqp_url for p in (first, second)]
        settings = BrokerSettings(",".join(urls), topology.management_url, heartbeat=60)
        with Publisher(settings, sleep=lambda _: None, confirm_timeout=1.5) as publisher:
            publisher.publish(task_message("ok", 1, "m-before"))
            (silent,) = [p for p in (first, second) if p.open_connections == 1]
            silent.refuse()  # a reconnect to it fails at once: the other node takes it
            stall = threading.Thread(target=silent.stall, args=(20,), daemon=True)
            stall.start()
            started = time.monotonic()
            publisher.publish(task_message("ok", 2, "m-during"))
            took = time.monotonic() - started
            assert publisher.attempts_made == 3  # m-before, m-during twice
            other = second if silent is first else first
            assert other.open_connections == 1
        assert 1.5 <= took < 10, took  # the timeout and a reconnect; not the stall's 20 s
        stall.join(30)
    assert_republished_once_or_twice(topology)


@pytest.mark.timeout(60)
def test_a_blocking_publish_without_a_confirm_timeout_waits_for_the_link(
    topology: BrokerSettings,
) -> None:
    """confirm_timeout=None: the publish waits on its connection until the link flows again."""
    with FaultProxy((topology.host, topology.port)) as proxy:
        settings = through(topology, proxy.port, heartbeat=60)
        with Publisher(settings, confirm_timeout=None) as publisher:
            publisher.publish(task_message("ok", 1, "m-before"))
            stall = threading.Thread(target=proxy.stall, args=(4,), daemon=True)
            stall.start()
            started = time.monotonic()
            publisher.publish(task_message("ok", 2, "m-during"))
            took = time.monotonic() - started
            assert (publisher.attempts_made, proxy.connections) == (2, 1)
        stall.join(10)
    assert 3 <= took < 15, took
