"""Scenario S10 (rabbitmq-server #3032, celery #6760): a handler outlives the broker's consumer
timeout. The outcome depends on the version and the queue type (checked on 3.10.8, 4.0.5 and
4.3.6; docs/rabbitmq-versions.md):

* up to 4.2, classic and quorum queues alike: the channel is closed with 406
  PRECONDITION_FAILED; the consumer reconnects, the message is redelivered and is a duplicate;
* 4.3 classic queues: no consumer timeout at all - the slow handler finishes and is acked;
* 4.3 quorum queues (``x-consumer-timeout`` argument, ``consumer-timeout`` policy key, or the
  global ``consumer_timeout``; milliseconds): the broker returns the message to the queue and
  sends basic.cancel; the channel stays open, the late basic.ack is ignored, the consumer
  resubscribes and the redelivery is a duplicate.

In every case the message's effect is applied exactly once.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.message import Task, encode_json
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import Topology, apply_topology, load_topology, with_queue_type
from lab.handler import task_message
from tests.brokers import TestBroker
from tests.support import TEST_CONCURRENCY, consumer_config, ready_count, run_script

# foundation too: its outcome differs by version, so CI runs it on 3.10 and 4.0 as well
pytestmark = [pytest.mark.integration, pytest.mark.failure_model, pytest.mark.foundation]

TIMEOUT_MS = 2000
SLOW = 6.0  # seconds: three times the timeout


def quorum_topology(consumer_timeout: str | None = None) -> Topology:
    """The lab topology's quorum variant (``with_queue_type``). With ``consumer_timeout``
    "argument" or "policy", q:tasks gets a 2 s consumer timeout that way: the
    ``x-consumer-timeout`` declare argument, or the ``consumer-timeout`` key in its one policy."""
    base = with_queue_type(load_topology(), "quorum")
    work = base.names.queue
    queues = tuple(
        dataclasses.replace(q, arguments=(*q.arguments, ("x-consumer-timeout", TIMEOUT_MS)))
        if q.name == work and consumer_timeout == "argument"
        else q
        for q in base.queues
    )
    policies = tuple(
        dataclasses.replace(p, definition=(*p.definition, ("consumer-timeout", TIMEOUT_MS)))
        if p is base.policy_for(work) and consumer_timeout == "policy"
        else p
        for p in base.policies
    )
    return dataclasses.replace(base, queues=queues, policies=policies)


@pytest.fixture
def global_timeout(broker: TestBroker) -> Iterator[None]:
    """The broker's global consumer_timeout at 2 s for new channels, checked every 500 ms
    (RabbitMQ's own tests do so); restored afterwards."""
    if broker.ctl_fn is None:
        pytest.skip("the broker came from EAI_AMQP_URL: the tests cannot change consumer_timeout")
    broker.ctl("eval", f"application:set_env(rabbit, consumer_timeout, {TIMEOUT_MS}).")
    broker.ctl("eval", "application:set_env(rabbit, channel_tick_interval, 500).")
    try:
        yield
    finally:
        broker.ctl("eval", "application:set_env(rabbit, consumer_timeout, 1800000).")
        broker.ctl("eval", "application:set_env(rabbit, channel_tick_interval, 60000).")


def effects(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return sorted(r[0] for r in db.execute("SELECT message_id FROM effects"))


def run_slow_once(
    settings: BrokerSettings, tmp_path: Path, ids: tuple[str, ...] = ("m-s10",), prefetch: int = 1
) -> tuple[Consumer, list[str], list[DeliveryReport]]:
    """Publish ``ids``; consume them with a handler that takes SLOW seconds the first time it
    sees m-s10 and records one effect per run; return the consumer, the handler's calls and the
    reports once the consumer has been idle for 1.5 s."""
    with Publisher(settings) as publisher:
        for n, message_id in enumerate(ids):
            publisher.publish(task_message("ok", n, message_id))
    calls: list[str] = []

    def slow_once(task: Task, db: Any) -> None:
        calls.append(task.message_id)
        if task.message_id == "m-s10" and calls.count("m-s10") == 1:
            threading.Event().wait(SLOW)
        db.execute("CREATE TABLE IF NOT EXISTS effects (message_id TEXT)")
        db.execute("INSERT INTO effects(message_id) VALUES (?)", (task.message_id,))

    reports: list[DeliveryReport] = []
    consumer = Consumer(
        settings,
        slow_once,
        SqliteDedupStore(tmp_path / "d.sqlite3"),
        consumer_config(prefetch=prefetch, idle_exit=1.5),
        on_report=reports.append,
    )
    consumer.run()
    return consumer, calls, reports


def reconnect_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "reconnecting in" in r.getMessage()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_consumer_timeout_closes_the_channel_and_consumer_resubscribes(
    broker: TestBroker,
    vhost: BrokerSettings,
    tmp_path: Path,
    global_timeout: None,
    caplog: pytest.LogCaptureFixture,
    queue_type: str,
) -> None:
    """Up to 4.2, either queue type: the broker closes the channel (406), the consumer
    reconnects, the message is redelivered once and processed once (dedup)."""
    if broker.at_least(4, 3):
        pytest.skip(
            "RabbitMQ 4.3+ closes no channel on a consumer timeout: classic queues have none, "
            "quorum queues cancel the consumer (the 4.3 tests below)"
        )
    apply_topology(vhost, load_topology() if queue_type == "classic" else quorum_topology())
    caplog.set_level(logging.WARNING, "amqp_lab.consuming.consumer")
    consumer, calls, reports = run_slow_once(vhost, tmp_path)
    assert calls == ["m-s10"]  # the redelivery was recognised as done, not run again
    # the first settlement was dropped with its channel; the redelivery is the duplicate
    assert [(r.message_id, r.outcome, r.redelivered) for r in reports] == [
        ("m-s10", "duplicate", True)
    ]
    assert consumer.connections_opened == 2
    [warning] = reconnect_warnings(caplog)
    assert "PRECONDITION_FAILED" in warning and "timed out" in warning, warning
    assert effects(tmp_path / "d.sqlite3") == ["m-s10"]
    assert ready_count(vhost, "q:tasks") == 0


@pytest.mark.timeout(120)
def test_classic_queues_on_4_3_have_no_consumer_timeout(
    broker: TestBroker,
    topology: BrokerSettings,
    tmp_path: Path,
    global_timeout: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """4.3 classic queues no longer evaluate consumer_timeout (4.3.0 release notes): the
    handler outlives it threefold, finishes, is acked on the same channel; nothing is closed
    or redelivered."""
    if not broker.at_least(4, 3):
        pytest.skip("before 4.3 classic queues enforce consumer_timeout (the test above)")
    caplog.set_level(logging.WARNING, "amqp_lab.consuming.consumer")
    consumer, calls, reports = run_slow_once(topology, tmp_path)
    assert calls == ["m-s10"]
    assert [(r.message_id, r.outcome, r.redelivered) for r in reports] == [
        ("m-s10", "processed", False)
    ]
    assert consumer.connections_opened == 1  # no channel close, no cancel
    assert reconnect_warnings(caplog) == []
    assert effects(tmp_path / "d.sqlite3") == ["m-s10"]
    assert ready_count(topology, "q:tasks") == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("set_by", ["argument", "policy", "global"])
def test_quorum_consumer_timeout_on_4_3_cancels_the_consumer_which_resubscribes(
    broker: TestBroker,
    vhost: BrokerSettings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
    set_by: str,
) -> None:
    """4.3 quorum queue, a 2 s consumer timeout set by ``x-consumer-timeout``, by the
    ``consumer-timeout`` policy key or by the global ``consumer_timeout``: the broker returns
    the deliveries to the queue and sends basic.cancel. The slow handler's commit stands and
    its late basic.ack is ignored (the channel stays open); the deliveries received with it
    but not started go back without running; the consumer resubscribes; m-s10's redelivery is
    a duplicate, the others run once."""
    if not broker.at_least(4, 3):
        pytest.skip(
            "before 4.3 a consumer timeout closes the channel on quorum queues too "
            "(test_consumer_timeout_closes_the_channel_and_consumer_resubscribes[quorum])"
        )
    if set_by == "global":
        request.getfixturevalue("global_timeout")
    apply_topology(vhost, quorum_topology(None if set_by == "global" else set_by))
    caplog.set_level(logging.WARNING, "amqp_lab.consuming.consumer")
    ids = ("m-s10", "m-b1", "m-b2")
    consumer, calls, reports = run_slow_once(vhost, tmp_path, ids, prefetch=3)
    assert sorted(calls) == sorted(ids)  # each handler ran once: m-s10's redelivery is a dup
    outcomes = [(r.message_id, r.outcome, r.redelivered) for r in reports]
    assert outcomes[0] == ("m-s10", "processed", False) or TEST_CONCURRENCY > 1
    assert ("m-s10", "duplicate", True) in outcomes
    assert sorted(str(r.message_id) for r in reports if r.outcome == "processed") == sorted(ids)
    if TEST_CONCURRENCY == 1:  # m-b1 and m-b2 waited behind m-s10: returned, run on resubscribe
        assert outcomes[1:] == [
            ("m-s10", "duplicate", True),
            ("m-b1", "processed", True),
            ("m-b2", "processed", True),
        ]
    assert consumer.connections_opened == 2
    [warning] = reconnect_warnings(caplog)
    assert "cancelled the consumer" in warning and "PRECONDITION" not in warning, warning
    assert effects(tmp_path / "d.sqlite3") == sorted(ids)
    assert ready_count(vhost, "q:tasks") == 0


@pytest.mark.timeout(120)
def test_a_cancel_read_while_waiting_for_a_free_handler_starts_nothing_more(
    broker: TestBroker, vhost: BrokerSettings, tmp_path: Path
) -> None:
    """4.3 quorum, 2 handlers, both slow past the consumer timeout, a third delivery waiting for
    a free handler: the basic.cancel is read while the consumer waits, so the third delivery
    (which the broker has returned already) is handed back, not run on the cancelled
    subscription. It runs once, after the resubscription - never processed and then a
    duplicate."""
    if not broker.at_least(4, 3):
        pytest.skip("before 4.3 a consumer timeout closes the channel instead of cancelling")
    apply_topology(vhost, quorum_topology("argument"))
    ids = ("m-slow-1", "m-slow-2", "m-third")
    with Publisher(vhost) as publisher:
        for n, message_id in enumerate(ids):
            publisher.publish(task_message("ok", n, message_id))
    calls: list[str] = []

    def slow_first_two(task: Task, db: Any) -> None:
        calls.append(task.message_id)
        if task.message_id != "m-third" and calls.count(task.message_id) == 1:
            threading.Event().wait(SLOW)
        db.execute("CREATE TABLE IF NOT EXISTS effects (message_id TEXT)")
        db.execute("INSERT INTO effects(message_id) VALUES (?)", (task.message_id,))

    reports: list[DeliveryReport] = []
    consumer = Consumer(
        vhost,
        slow_first_two,
        SqliteDedupStore(tmp_path / "d.sqlite3"),
        consumer_config(prefetch=3, concurrency=2, idle_exit=1.5),
        on_report=reports.append,
    )
    consumer.run()
    third = [(r.outcome, r.redelivered) for r in reports if r.message_id == "m-third"]
    assert third == [("processed", True)], third  # handed back at the cancel, run once after
    assert calls.count("m-third") == 1
    assert effects(tmp_path / "d.sqlite3") == sorted(ids)
    assert ready_count(vhost, "q:tasks") == 0


@pytest.mark.timeout(90)
def test_the_worker_warns_once_about_a_handler_past_handler_warn_after_and_lets_it_finish(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """The worker's own handler-time limit (what is left on 4.3 classic queues): a handler that
    runs 3 s with ``--handler-warn-after 1`` is named once on stderr, with its queue and the
    seconds so far, and is not stopped: it finishes and its message is processed; the quick
    message behind it is never named."""
    slow = dataclasses.replace(
        task_message("slow", 1, "m-slow"),
        body=encode_json({"kind": "slow", "seq": 1, "seconds": 3}),
    )
    with Publisher(topology) as publisher:
        publisher.publish(slow)
        publisher.publish(task_message("ok", 2, "m-quick"))
    result = run_script(
        topology,
        "worker.py",
        "--handler-warn-after",
        "1",
        "--idle-exit",
        "1.5",
        "--concurrency",
        "1",
        "--dedup-path",
        str(tmp_path / "d.sqlite3"),
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "handler_warn_after" in line]
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith(
        "WARNING amqp_lab.consuming.handler_watch: handler of message_id=m-slow on queue "
        "'q:tasks' has run for 1."
    ), warnings[0]
    assert warnings[0].endswith(
        "s (handler_warn_after 1 s); it is not stopped: the delivery stays unacked until it returns"
    )
    outcomes = [line.split()[:2] for line in result.stdout.splitlines() if "outcome=" in line]
    assert outcomes == [
        ["message_id=m-slow", "outcome=processed"],
        ["message_id=m-quick", "outcome=processed"],
    ]
    assert ready_count(topology, "q:tasks") == 0


def test_a_bad_handler_warn_after_is_one_clear_error(topology: BrokerSettings) -> None:
    result = run_script(topology, "worker.py", "--handler-warn-after", "0")
    assert result.returncode == 2
    assert "--handler-warn-after must be > 0 seconds" in result.stderr
