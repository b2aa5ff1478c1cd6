"""Property (issue 5, case 8): random bodies and headers never kill the worker, never stick the
queue, and every message ends processed (or duplicate) or in the DLQ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.settings import BrokerSettings
from amqp_lab.typed_fields import table_from_typed
from lab.handler import lab_handler
from tests.support import consumer_config, get_all, ready_count

pytestmark = pytest.mark.integration

bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b"{}",
            b'{"kind": 1}',
            b'{"kind": "ok"}',
            b'{"kind": "bad"}',
            b'{"kind": "invalid"}',
            b'{"kind": "flaky"}',
            b'{"kind": "nope"}',
            b"[" * 5000,
        ]
    ),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3).map(
        lambda d: json.dumps(d).encode()
    ),
)
messages = st.fixed_dictionaries(
    {
        "body": bodies,
        "message_id": st.one_of(st.none(), st.text(min_size=1, max_size=12)),
        "content_type": st.sampled_from(
            [None, "application/json", "text/plain", "application/json; charset=utf-8"]
        ),
        "attempts": st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3), st.booleans()),
    }
)


@pytest.mark.timeout(300)
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(messages, min_size=1, max_size=12))
def test_every_random_message_ends_processed_or_in_dlq(
    topology: BrokerSettings, tmp_path_factory: pytest.TempPathFactory, batch: list[dict[str, Any]]
) -> None:
    get_all(topology, "q:tasks:dlq")  # the vhost is shared between examples: start clean
    get_all(topology, "q:tasks:audit")
    with open_channel(topology) as channel:
        channel.confirm_delivery()
        for i, m in enumerate(batch):
            headers: dict[str, Any] = {"probe": i}
            if m["attempts"] is not None:
                headers["attempts"] = m["attempts"]
            channel.basic_publish(
                "tasks",
                "task",
                m["body"],
                pika.BasicProperties(
                    message_id=m["message_id"],
                    content_type=m["content_type"],
                    delivery_mode=2,
                    headers=headers,
                ),
                mandatory=True,
            )
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(Path(tmp_path_factory.mktemp("dedup")) / "d.sqlite3")
    Consumer(
        topology,
        lab_handler,
        store,
        consumer_config(prefetch=5, idle_exit=1.0),
        on_report=reports.append,
    ).run()
    final = [r for r in reports if r.outcome in ("processed", "duplicate", "dead-lettered")]
    assert len(final) == len(batch)
    assert {r.outcome for r in reports} <= {"processed", "duplicate", "dead-lettered", "requeued"}
    dead = get_all(topology, "q:tasks:dlq")
    assert len(dead) == sum(r.outcome == "dead-lettered" for r in final)
    probes = [table_from_typed(json.loads(b)["headers"])["probe"] for _, _, b in dead]
    assert sorted(probes) == sorted(set(probes))  # each dead-lettered message once
    assert ready_count(topology, "q:tasks") == 0
