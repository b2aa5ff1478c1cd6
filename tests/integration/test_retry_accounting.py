"""Retry accounting counts failures only: a delivery that a drain, a stop or a lost connection
handed back without running comes back redelivered, and still gets its whole retry budget -
in requeue and backoff mode, on classic and quorum queues, on every version CI runs
(docs/failure-model.md, "Retry accounting")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.errors import TransientError
from amqp_lab.message import Task
from amqp_lab.retry.policy import RetryPolicy
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, with_queue_type
from tests.support import consumer_config, publish, ready_count, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.foundation,
    pytest.mark.failure_model,
    pytest.mark.timeout(120),
]

RETRIES = {
    "requeue": RetryPolicy(),
    "backoff": RetryPolicy("backoff", max_attempts=2, base=0.05, cap=0.05),
}


@pytest.fixture(params=["classic", "quorum"])
def queues(request: pytest.FixtureRequest, vhost: BrokerSettings) -> BrokerSettings:
    apply_topology(vhost, with_queue_type(load_topology(), request.param))
    return vhost


def _hand_back_unstarted(settings: BrokerSettings, store_path: Path, retry: RetryPolicy) -> None:
    """A consumer with prefetch 2 runs m-first (held until the stop is asked for) while
    m-second waits in its prefetch; the drain then hands m-second back without running it."""
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def handler(task: Task, db: Any) -> None:
        ran.append(task.message_id)
        started.set()
        release.wait(30)

    store = SqliteDedupStore(store_path)
    consumer = Consumer(
        settings,
        handler,
        store,
        consumer_config(prefetch=2, concurrency=1, retry=retry),
        on_report=lambda r: None,
    )
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert started.wait(20)
        consumer.stop("test: drain")
        release.set()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        release.set()
        store.close()
    assert ran == ["m-first"]  # m-second never ran: it went back


@pytest.mark.parametrize("mode", ["requeue", "backoff"])
def test_a_delivery_handed_back_by_a_drain_keeps_its_whole_retry_budget(
    queues: BrokerSettings, tmp_path: Path, mode: str
) -> None:
    retry = RETRIES[mode]
    publish(queues, ("ok", "m-first"), ("ok", "m-second"))
    _hand_back_unstarted(queues, tmp_path / "d.sqlite3", retry)
    wait_for(lambda: ready_count(queues, "q:tasks") == 1, what="m-second back in the queue")

    calls: list[tuple[int, bool]] = []

    def fails_once(task: Task, db: Any) -> None:
        calls.append((task.attempt, task.redelivered))
        if len(calls) == 1:
            raise TransientError("503 from upstream")

    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    try:
        Consumer(
            queues,
            fails_once,
            store,
            consumer_config(prefetch=1, idle_exit=1.5, retry=retry),
            on_report=reports.append,
        ).run()
    finally:
        store.close()
    # the hand-back used up nothing: the first failure is retried, not dead-lettered
    assert calls[0] == (1, True)  # redelivered, yet attempt 1
    assert [(r.message_id, r.outcome, r.attempts) for r in reports] == [
        ("m-second", "requeued" if mode == "requeue" else "retried", 1),  # issue 23
        ("m-second", "processed", 2),
    ]
    assert ready_count(queues, "q:tasks:dlq") == 0
