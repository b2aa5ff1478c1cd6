"""Failure model, the publishing side and the records: outcomes that belong to the exact
publish, messages refused before they can close a channel, DLQ records that lose nothing, the
retry topology checked, what mandatory cannot see, and a consumer plus a pipelined publisher
kept correct through a fault-injecting proxy."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.dlq.ops import browse, replay
from amqp_lab.errors import (
    MessageUnroutable,
    PreconditionFailed,
    UnencodableMessage,
)
from amqp_lab.fieldtable import TaggedInt, encode_table, tagged_int
from amqp_lab.message import (
    BOOKKEEPING_HEADERS,
    BROKER_HEADERS,
    encode_json,
)
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.publishing.pipelined import PipelinedPublisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology
from lab.handler import lab_handler, task_message
from tests.amqp_values import field_tables, same
from tests.brokers import TestBroker
from tests.faultproxy import FaultProxy
from tests.integration.test_failure_model import Running
from tests.support import (
    NAMES,
    consumer_config,
    consumer_count,
    get_all,
    lab_message,
    one_error_line,
    publish,
    ready_count,
    run_script,
    run_worker,
    through,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]


# --- publisher outcomes belong to the exact publish -----------------------------------------
@pytest.mark.parametrize("bad_first", [True, False], ids=["bad-then-good", "good-then-bad"])
def test_the_same_message_id_in_flight_twice_gets_two_outcomes(
    topology: BrokerSettings, bad_first: bool
) -> None:
    good = task_message("ok", 1, "twin")
    bad = task_message("ok", 1, "twin", routing_key="nowhere")
    order = [bad, good] if bad_first else [good, bad]
    with PipelinedPublisher(topology, window=100) as publisher:
        futures = [publisher.publish_async(m) for m in order * 20]
        outcomes = [f.exception(30) for f in futures]
    for message, error in zip(order * 20, outcomes, strict=True):
        if message.routing_key == "nowhere":
            assert isinstance(error, MessageUnroutable)
        else:
            assert error is None
    assert ready_count(topology, "q:tasks") == 20


def test_properties_the_broker_would_refuse_fail_alone_before_sending(
    topology: BrokerSettings,
) -> None:
    bad = {
        "expiration -1": lab_message(body=b"{}", message_id="bad-exp", expiration="-1"),
        "priority 300": lab_message(body=b"{}", message_id="bad-prio", priority=300),
        "a set header": lab_message(body=b"{}", message_id="bad-hdr", headers={"s": {1}}),
        "an int past 64 bits": lab_message(body=b"{}", message_id="bad-int", headers={"n": 2**70}),
        "a 300-byte type": lab_message(body=b"{}", message_id="bad-type", type="t" * 300),
    }
    good = [task_message("ok", i, f"good-{i}") for i in range(len(bad) + 1)]
    mixed = [m for pair in zip(good, [*bad.values(), None], strict=True) for m in pair if m]
    with PipelinedPublisher(topology, window=100) as publisher:
        batch = publisher.publish_many(mixed).wait()
        assert publisher.reconnects == 0
        assert publisher.channel_closes == 0  # none of them reached the broker
    assert batch.confirmed == len(good)
    assert sorted(m.message_id for m, _ in batch.failures) == sorted(
        m.message_id for m in bad.values()
    )
    assert all(isinstance(e, UnencodableMessage) for _, e in batch.failures)
    with Publisher(topology) as publisher, pytest.raises(UnencodableMessage, match="expiration"):
        publisher.publish(bad["expiration -1"])
    assert sorted(p.message_id for _, p, _ in get_all(topology, "q:tasks")) == sorted(
        m.message_id for m in good
    )


@pytest.mark.timeout(90)
def test_a_channel_close_goes_to_the_message_that_caused_it(
    broker: TestBroker, topology: BrokerSettings
) -> None:
    """A message over the broker's max_message_size closes the channel with 406 naming its
    size: that message fails; the others in flight are republished once (same message_id)."""
    with broker.max_message_size(4096):
        messages = [task_message("ok", i, f"m-{i}") for i in range(30)]
        messages[12] = lab_message(body=b"x" * 6000, message_id="m-big")
        with PipelinedPublisher(topology, window=100) as publisher:
            batch = publisher.publish_many(messages).wait()
    ((failed, error),) = batch.failures
    assert failed.message_id == "m-big"
    assert isinstance(error, PreconditionFailed) and "message size 6000" in str(error)
    assert batch.confirmed == 29
    ids = Counter(p.message_id for _, p, _ in get_all(topology, "q:tasks"))
    assert set(ids) == {m.message_id for m in messages} - {"m-big"}
    assert max(ids.values()) <= 2  # republished at most once


# --- DLQ records are lossless and explain themselves -----------------------------------------
@pytest.mark.timeout(300)
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(headers=field_tables, body=st.binary(max_size=40))
def test_every_field_type_survives_dlq_and_replay_on_the_broker(
    broker: TestBroker,
    topology: BrokerSettings,
    tmp_path_factory: pytest.TempPathFactory,
    headers: dict[str, Any],
    body: bytes,
) -> None:
    """Published with headers of every AMQP type, dead-lettered, replayed: the copy that reaches
    the work queue and the audit queue again has the same headers (types and bytes) and body."""
    for queue in ("q:tasks", "q:tasks:audit", "q:tasks:dlq"):
        get_all(topology, queue)  # the vhost is shared between examples
    headers = {k: v for k, v in headers.items() if k not in BOOKKEEPING_HEADERS | BROKER_HEADERS}
    expected = as_the_broker_delivers(headers, broker.version)
    message_id = f"m-{uuid.uuid4().hex[:8]}"
    with Publisher(topology) as publisher:  # not JSON, or no kind: a business error
        publisher.publish(lab_message(body=b"\x00" + body, message_id=message_id, headers=headers))
    store = SqliteDedupStore(tmp_path_factory.mktemp("d") / "d.sqlite3")
    Consumer(topology, lab_handler, store, consumer_config(idle_exit=0.5)).run()
    get_all(topology, "q:tasks:audit")
    (result,) = replay(topology, lambda entry: True, queue=NAMES.dlq)
    assert result.status == "replayed"
    for queue in ("q:tasks", "q:tasks:audit"):
        ((method, props, got),) = get_all(topology, queue)
        replayed = dict(props.headers)
        assert replayed.pop("attempts") == 0
        assert (method.exchange, method.routing_key, got) == ("tasks", "task", b"\x00" + body)
        assert same(replayed, expected)
        assert encode_table(replayed) == encode_table(expected)


def as_the_broker_delivers(headers: dict[str, Any], version: str) -> dict[str, Any]:
    """What the broker itself changes on the way (checked on 4.0.5; 3.10 changes nothing):
    RabbitMQ 4.x delivers the top-level header keys sorted (by their bytes) and an ``L``
    (signed 64) as ``l``."""
    if version.startswith("3."):
        return headers

    def tags(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: tags(v) for k, v in value.items()}
        if isinstance(value, list):
            return [tags(v) for v in value]
        if isinstance(value, TaggedInt) and value.tag == "L":
            return tagged_int(int(value), "l")
        return value

    return {k: tags(headers[k]) for k in sorted(headers, key=lambda k: k.encode())}


def test_an_unknown_exception_is_classified_unknown_with_its_traceback(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    publish(topology, ("bad", "m-bug"))
    run_worker(topology, tmp_path)
    ((_, props, body),) = get_all(topology, "q:tasks:dlq")
    record = json.loads(body)
    assert record["classification"] == "unknown"
    assert record["error"]["type"] == "RuntimeError"
    assert "lab_handler" in record["error"]["traceback"]
    assert record["error"]["traceback"].endswith(
        "RuntimeError: bug in task handler: division by zero\n"
    )
    assert record["attempts"] == props.headers["attempts"] == 2


def test_after_retry_hops_the_record_names_the_original_and_replay_reaches_the_audit_queue(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    publish(topology, ("bad", "m-hops"))
    get_all(topology, "q:tasks:audit")
    run_worker(topology, tmp_path, "--retry", "backoff", "--max-attempts", "3", "--base", "0.05")
    (entry,) = browse(topology, NAMES.dlq)  # left in the DLQ
    record = json.loads(encode_json(entry.as_dict()))
    assert (entry.attempts, entry.exchange, entry.routing_key) == (3, "tasks", "task")
    assert entry.headers == {}  # the retry bookkeeping is not the publisher's
    assert record["original"] == {"exchange": "tasks", "routing_key": "task"}
    result = run_script(topology, "replay.py", "--all", "--audit-log", str(tmp_path / "a.jsonl"))
    assert result.returncode == 0, result.stderr
    (audit,) = get_all(topology, "q:tasks:audit")  # every binding sees the replay again
    assert audit[1].message_id == "m-hops"
    assert ready_count(topology, "q:tasks") == 1


# --- the retry topology is checked, not assumed ----------------------------------------------
def backoff_worker(settings: BrokerSettings, tmp_path: Path, max_attempts: int) -> Any:
    """worker.py in backoff mode until 1 s idle; its CompletedProcess."""
    return run_script(
        settings,
        "worker.py",
        *("--retry", "backoff", "--max-attempts", str(max_attempts), "--idle-exit", "1"),
        *("--dedup-path", str(tmp_path / "d.sqlite3")),
    )


def _await_policy(broker: TestBroker, vhost: str, queue: str, key: str, name: str) -> None:
    with broker.admin() as api:
        wait_for(
            lambda: (api.queue(vhost, queue) or {}).get(key) == name,
            30,
            what=f"{key} {name} effective on {queue}",
        )


@pytest.mark.timeout(60)
def test_a_higher_priority_policy_without_the_retry_dlx_stops_the_worker_naming_it(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    with broker.admin() as api:
        api.put_policy(topology.vhost, "catch-all", "^q:tasks:wait:", {"max-length": 1000}, 100)
    _await_policy(broker, topology.vhost, "q:tasks:wait:1", "policy", "catch-all")
    publish(topology, ("bad", "m-1"))
    result = backoff_worker(topology, tmp_path, max_attempts=3)
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert "wait queue 'q:tasks:wait:1' dead-letters to None" in line
    assert "policy 'catch-all'" in line
    assert result.stdout == ""  # nothing consumed, no retry copy confirmed
    assert ready_count(topology, "q:tasks") == 1


@pytest.mark.timeout(60)
def test_an_operator_policy_that_expires_wait_queues_stops_the_worker_naming_it(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    with broker.admin() as api:
        api.put_operator_policy(topology.vhost, "ops-expire", "^q:tasks:wait:", {"expires": 600000})
    _await_policy(broker, topology.vhost, "q:tasks:wait:1", "operator_policy", "ops-expire")
    result = backoff_worker(topology, tmp_path, max_attempts=2)
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert "expires after 600000 ms" in line and "operator policy 'ops-expire'" in line


# --- what mandatory cannot see ---------------------------------------------------------------
@pytest.mark.timeout(60)
def test_health_reports_a_missing_work_queue_and_one_nobody_consumes(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    with open_channel(topology) as channel:
        channel.queue_delete("q:tasks")
    published = run_script(topology, "publish.py", "--count", "1")
    assert published.returncode == 0  # confirmed: the audit queue took the routing key
    missing = run_script(topology, "health.py")
    assert missing.returncode == 2
    assert missing.stdout.startswith(
        f"ALERT: work queue 'q:tasks' does not exist in vhost '{topology.vhost}'"
    )
    apply_topology(topology, load_topology())
    idle = run_script(topology, "health.py")
    assert (idle.returncode, idle.stdout) == (
        2,
        "ALERT: work queue 'q:tasks' has 0 consumer(s), fewer than 1; 0 message(s) waiting\n",
    )
    consumer = Consumer(
        topology, lab_handler, SqliteDedupStore(tmp_path / "d.sqlite3"), consumer_config()
    )
    running = Running(consumer)
    wait_for(lambda: consumer_count(topology, "q:tasks") == 1, what="consumer subscribed")
    healthy = run_script(topology, "health.py", "--dlq-depth", "0")
    consumer.stop()
    running.join()
    assert healthy.returncode == 0, healthy.stdout
    assert healthy.stdout.startswith("ok: 'q:tasks'")


# --- through a fault-injecting proxy: cut, stall, half-open, slow ----------------------------
@pytest.mark.timeout(240)
def test_consumer_and_pipelined_publisher_keep_the_invariant_through_faults(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Every confirmed message is processed once or is in the DLQ, whatever the wire does."""
    n = 400
    with (
        FaultProxy((topology.host, topology.port)) as pub_proxy,
        FaultProxy((topology.host, topology.port)) as con_proxy,
    ):
        reports: list[DeliveryReport] = []
        store = SqliteDedupStore(tmp_path / "d.sqlite3")
        consumer = Consumer(
            through(topology, con_proxy.port, heartbeat=2),
            lab_handler,
            store,
            consumer_config(prefetch=20, ack_batch=5, reconnect_attempts=50),
            on_report=reports.append,
        )
        running = Running(consumer)
        confirmed: list[str] = []
        futures: list[tuple[str, Future[None]]] = []
        publisher = PipelinedPublisher(
            through(topology, pub_proxy.port, heartbeat=2), window=50, max_reconnects=50
        )

        def publish_all() -> None:
            for i in range(n):
                kind = "invalid" if i % 25 == 0 else "ok"
                message = task_message(kind, i, f"m-{i}")
                futures.append((message.message_id, publisher.publish_async(message)))
                time.sleep(0.01)

        feeder = threading.Thread(target=publish_all, daemon=True)
        feeder.start()

        def cut_both() -> None:
            pub_proxy.cut()
            con_proxy.cut()

        def slow_both() -> None:
            con_proxy.slow(0.05)
            pub_proxy.slow(0.05)

        faults: list[Callable[[], None]] = [
            cut_both,
            lambda: con_proxy.stall(7),  # longer than two heartbeats
            lambda: pub_proxy.stall(7),
            con_proxy.half_open,
            pub_proxy.half_open,
            slow_both,
        ]
        for fault in faults:
            time.sleep(0.8)
            fault()
        con_proxy.slow(0)
        pub_proxy.slow(0)
        feeder.join(120)
        for message_id, future in futures:
            try:
                future.result(120)
                confirmed.append(message_id)
            except Exception:
                pass  # not confirmed: no promise was made for it
        publisher.close()
        done = set(confirmed)
        wait_for(
            lambda: done <= {r.message_id for r in reports if r.outcome != "requeued"},
            120,
            what="every confirmed message settled",
        )
        consumer.stop()
        running.join(60)
        store.close()
    assert running.error is None
    assert len(confirmed) > n * 0.8
    with sqlite3.connect(tmp_path / "d.sqlite3") as db:  # the handler's effects, committed
        applied = Counter(r[0] for r in db.execute("SELECT message_id FROM effects"))
    dead = {p.message_id for _, p, _ in get_all(topology, "q:tasks:dlq")}
    lost = [m for m in confirmed if m not in applied and m not in dead]
    twice = [m for m, count in applied.items() if count > 1]
    assert (lost, twice) == ([], [])
    invalid = {f"m-{i}" for i in range(0, n, 25)}
    assert {m for m in confirmed if m in invalid} <= dead <= invalid
    assert consumer.connections_opened > 1 and publisher.reconnects > 0  # the faults bit


@pytest.mark.timeout(60)
def test_headers_larger_than_a_frame_fail_alone_instead_of_killing_the_connection(
    topology: BrokerSettings,
) -> None:
    """RabbitMQ answers a header frame over frame_max by closing the whole connection (501);
    such a message used to be republished on every reconnect, forever."""
    huge = lab_message(body=b"{}", message_id="m-huge", headers={"pad": "x" * 140_000})
    with PipelinedPublisher(topology, window=10) as publisher:
        future = publisher.publish_async(huge)
        publisher.publish(task_message("ok", 1, "m-ok"), timeout=30)
        with pytest.raises(UnencodableMessage, match="more than one frame carries"):
            future.result(10)
        assert publisher.reconnects == 0


@pytest.mark.timeout(60)
def test_a_publisher_closed_while_a_nack_retry_waits_resolves_it(vhost: BrokerSettings) -> None:
    with open_channel(vhost) as channel:
        channel.queue_declare(
            "q:full", durable=True, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
        )
    publisher = PipelinedPublisher(vhost, window=10, max_attempts=5, base=30, cap=30)
    future = publisher.publish_async(
        task_message("ok", 1, "m-nacked", exchange="", routing_key="q:full")
    )
    wait_for(lambda: publisher._flight.waiting, what="nacked once, its retry waiting (up to 30 s)")
    started = time.monotonic()
    publisher.close(flush_timeout=1)
    error = future.exception(10)
    assert error is not None and "closed before the broker confirmed" in str(error)
    assert time.monotonic() - started < 10
