"""Several broker addresses on a real broker: a list whose other nodes are dead still connects
(the connection, the publishers, a worker script), and a list of dead nodes is one clear error.
The three-node cluster tests (tests/integration/test_cluster.py) kill real nodes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from amqp_lab.connection import close_quietly, connect
from amqp_lab.errors import BrokerUnavailable
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message
from tests.support import publish, ready_count, run_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _dead_port() -> int:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_dead_nodes(settings: BrokerSettings, dead: int = 2) -> BrokerSettings:
    """The same broker listed among ``dead`` addresses where nothing listens."""
    live = settings.amqp_url
    user = f"{settings.username}:{settings.password}"
    path = live[live.index("/", live.index("@")) :]
    urls = [f"amqp://{user}@127.0.0.1:{_dead_port()}{path}" for _ in range(dead)]
    return BrokerSettings(
        ",".join([*urls[:1], live, *urls[1:]]),
        f"http://127.0.0.1:{_dead_port()},{settings.management_base}",
    )


def test_connect_skips_dead_nodes_whatever_node_it_starts_from(vhost: BrokerSettings) -> None:
    settings = with_dead_nodes(vhost)
    for _ in range(8):  # random start: every node comes first at some point
        connection = connect(settings)
        try:
            assert connection.is_open
        finally:
            close_quietly(connection)


def test_a_list_of_dead_nodes_is_one_clear_error(vhost: BrokerSettings) -> None:
    dead = BrokerSettings(
        f"amqp://app:s3cret@127.0.0.1:{_dead_port()}/v,amqp://app:s3cret@127.0.0.1:{_dead_port()}/v"
    )
    with pytest.raises(BrokerUnavailable) as raised:
        connect(dead)
    assert "s3cret" not in str(raised.value)
    assert str(dead.port) in str(raised.value)


def test_publishers_and_a_worker_take_the_list(topology: BrokerSettings, tmp_path: Path) -> None:
    settings = with_dead_nodes(topology)
    publish(settings, ("ok", "addr-1"), ("ok", "addr-2"))
    with PipelinedPublisher(settings) as publisher:
        publisher.publish(task_message("ok", 3, "addr-3"), timeout=30)
    wait_for(lambda: ready_count(topology, "q:tasks") == 3, what="3 messages in q:tasks")
    rows = run_worker(settings, tmp_path)
    assert sorted((r["message_id"], r["outcome"]) for r in rows) == [
        ("addr-1", "processed"),
        ("addr-2", "processed"),
        ("addr-3", "processed"),
    ]
