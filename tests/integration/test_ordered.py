"""Per-key ordering on a real broker: the ordered topology (consistent-hash exchange, shard
queues with single active consumer) and the ordered consumer's retries, dead-letters and
parked keys."""

from __future__ import annotations

import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.dedup import open_store
from amqp_lab.dlq.ops import browse, replay
from amqp_lab.dlq.summary import Selection
from amqp_lab.errors import BusinessError, TransientError
from amqp_lab.management import ManagementClient
from amqp_lab.message import Task, message_for
from amqp_lab.ordering import OrderedConfig, OrderedConsumer, ParkedKeys
from amqp_lab.ordering.config import parked_scope
from amqp_lab.publishing import Publisher
from amqp_lab.retry.policy import RetryPolicy
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, verify_topology
from amqp_lab.topology.ordered import with_ordered
from tests.pgsupport import temp_database
from tests.support import consumer_count, ready_count, run_script, run_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.foundation, pytest.mark.timeout(120)]

FAST = RetryPolicy("backoff", max_attempts=3, base=0.05, cap=0.2)
FIVE = RetryPolicy("backoff", max_attempts=5, base=0.05, cap=0.2)


@pytest.fixture
def ordered(vhost: BrokerSettings) -> BrokerSettings:
    apply_topology(vhost, with_ordered(load_topology(), shards=4))
    return vhost


def publish_keys(settings: BrokerSettings, plan: list[tuple[str, int]]) -> None:
    names = with_ordered(load_topology(), shards=4).names
    with Publisher(settings) as publisher:
        for key, seq in plan:
            body = {"key": key, "seq": seq}
            publisher.publish(message_for(names, body, message_id=f"{key}-{seq}", key=key))


class Recorder:
    """A handler that records (key, seq) in the dedup transaction and fails on cue."""

    def __init__(self, fail: dict[str, list[type[Exception]]] | None = None) -> None:
        self.fail = fail or {}
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, task: Task, db: Any) -> None:
        with self.lock:
            self.calls.append(task.message_id)
        db.execute("CREATE TABLE IF NOT EXISTS effects (id TEXT, key TEXT, seq INTEGER)")
        errors = self.fail.get(task.message_id)
        if errors:
            raise errors.pop(0)(f"failing {task.message_id} on cue")
        db.execute(
            "INSERT INTO effects (id, key, seq) VALUES (?, ?, ?)",
            (task.message_id, task.body["key"], task.body["seq"]),
        )


def effects(path: Path) -> list[tuple[str, str, int]]:
    import sqlite3

    with sqlite3.connect(path) as db:
        return [tuple(r) for r in db.execute("SELECT id, key, seq FROM effects ORDER BY rowid")]


def run_consumer(
    settings: BrokerSettings, handler: Recorder, db: Path | str, **options: Any
) -> OrderedConsumer:
    names = with_ordered(load_topology(), shards=4).names
    store = open_store(str(db))
    options.setdefault("retry", FAST)
    config = OrderedConfig(names, idle_exit=1.0, **options)
    consumer = OrderedConsumer(settings, handler, store, config)
    try:
        consumer.run()
    finally:
        store.close()
    return consumer


def test_the_ordered_topology_applies_verifies_and_spreads_keys(ordered: BrokerSettings) -> None:
    topology = with_ordered(load_topology(), shards=4)
    assert verify_topology(ordered, topology) == []
    publish_keys(ordered, [(f"k{i}", 1) for i in range(200)])
    with ManagementClient(ordered) as api:
        for shard in topology.names.shard_queues:
            info = api.queue(ordered.vhost, shard) or {}
            assert info.get("arguments", {}).get("x-single-active-consumer") is True
    counts = {}
    for shard in topology.names.shard_queues:
        counts[shard] = len(browse(ordered, shard))
    assert sum(counts.values()) == 200
    assert all(n > 0 for n in counts.values()), counts  # every shard gets keys
    assert len(browse(ordered, topology.names.audit_queue or "")) == 200  # the audit copy


def test_a_failing_key_holds_only_its_own_later_messages(
    ordered: BrokerSettings, tmp_path: Path
) -> None:
    plan = [(key, seq) for seq in range(1, 6) for key in ("a", "b", "c")]
    publish_keys(ordered, plan)
    handler = Recorder({"a-2": [TransientError, TransientError]})  # succeeds on the 3rd try
    run_consumer(ordered, handler, tmp_path / "s.db")
    done = effects(tmp_path / "s.db")
    assert sorted(i for i, _, _ in done) == sorted(f"{k}-{s}" for k, s in plan)  # once each
    for key in ("a", "b", "c"):
        assert [s for _, k, s in done if k == key] == [1, 2, 3, 4, 5]
    assert handler.calls.count("a-2") == 3
    # while a-2 waited, a-3 did not run before it, but the other keys went on
    first_a2 = handler.calls.index("a-2")
    assert handler.calls.index("a-3") > len(handler.calls) - 1 - handler.calls[::-1].index("a-2")
    others = [c for c in handler.calls[first_a2:] if not c.startswith("a-")]
    assert others, "other keys waited behind the failing key"


def test_continue_after_dead_letter_runs_the_key_on(
    ordered: BrokerSettings, tmp_path: Path
) -> None:
    publish_keys(ordered, [("a", 1), ("a", 2), ("a", 3)])
    handler = Recorder({"a-2": [BusinessError]})
    run_consumer(ordered, handler, tmp_path / "s.db")
    assert [i for i, _, _ in effects(tmp_path / "s.db")] == ["a-1", "a-3"]
    assert [e.message_id for e in browse(ordered, "q:tasks:dlq")] == ["a-2"]


def test_park_sends_the_key_to_the_dlq_until_a_replay_releases_it(
    ordered: BrokerSettings, tmp_path: Path
) -> None:
    publish_keys(ordered, [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2)])
    handler = Recorder({"a-1": [TransientError] * 3})  # exhausts 3 tries: dead-lettered
    db = tmp_path / "s.db"
    run_consumer(ordered, handler, db, after_dead_letter="park")
    assert [i for i, _, _ in effects(db)] == ["b-1", "b-2"]
    records = browse(ordered, "q:tasks:dlq")
    assert [(e.message_id, e.error_type) for e in records] == [
        ("a-1", "TransientError"),
        ("a-2", "KeyParked"),
        ("a-3", "KeyParked"),
    ]
    publish_keys(ordered, [("a", 4)])  # still parked: behind the others in the DLQ
    run_consumer(ordered, handler, db, after_dead_letter="park")
    assert [e.message_id for e in browse(ordered, "q:tasks:dlq")][-1] == "a-4"
    listed = run_script(ordered, "keys.py", "parked", "--dedup-path", str(db))
    assert listed.returncode == 0 and "key=a blocker=a-1 " in listed.stdout, listed.stderr
    not_parked = run_script(ordered, "keys.py", "parked", "--dedup-path", str(db), "--release", "b")
    assert not_parked.returncode == 1 and "not parked" in not_parked.stdout
    # the fix is in: replay the key, blocker first; it releases the key
    results = replay(ordered, Selection(key="a").matches, queue="q:tasks:dlq")
    assert [r.status for r in results] == ["replayed"] * 4
    run_consumer(ordered, handler, db, after_dead_letter="park")
    assert [i for i, _, _ in effects(db)] == ["b-1", "b-2", "a-1", "a-2", "a-3", "a-4"]
    assert browse(ordered, "q:tasks:dlq") == []
    listed = run_script(ordered, "keys.py", "parked", "--dedup-path", str(db))
    assert "0 parked key(s)" in listed.stdout


def test_a_nul_in_a_blocker_or_a_key_parks_and_runs_on_postgresql(ordered: BrokerSettings) -> None:
    """AMQP lets a message_id and a routing key hold a NUL character; PostgreSQL text cannot.
    Parking key a behind a-\\x00, and looking up whether key c\\x00 is parked, failed and
    stopped the worker (and every standby after it, on the redelivery). Now a-\\x00 is an
    invalid delivery, dead-lettered with a parked behind it, and c\\x00 runs."""
    names = with_ordered(load_topology(), shards=4).names
    with Publisher(ordered) as publisher:
        for message_id, key in (("a-\x00", "a"), ("a-2", "a"), ("b-1", "b"), ("c-1", "c\x00")):
            body = {"key": key[0], "seq": 1}
            publisher.publish(message_for(names, body, message_id=message_id, key=key))
    handler = Recorder()
    with temp_database() as url:
        run_consumer(ordered, handler, url, after_dead_letter="park")
        with closing(open_store(url)) as store:
            parked = ParkedKeys(store, parked_scope(ordered.vhost, names)).all()
    assert sorted(handler.calls) == ["b-1", "c-1"]
    records = browse(ordered, "q:tasks:dlq")
    assert sorted((e.message_id, e.error_type) for e in records) == [
        ("a-\x00", "InvalidMessage"),
        ("a-2", "KeyParked"),
    ]
    assert [(p.key, p.message_id) for p in parked] == [("a", "a-\x00")]


def test_a_standby_takes_a_shard_over_in_order(ordered: BrokerSettings, tmp_path: Path) -> None:
    """Two workers: each shard has one active consumer; the first stops with deliveries held
    (a key waiting for its retry) and the standby gets them back in order."""
    names = with_ordered(load_topology(), shards=4).names
    publish_keys(ordered, [("a", s) for s in range(1, 6)])
    first_store = open_store(str(tmp_path / "s.db"))
    blocked = Recorder({"a-1": [TransientError] * 2})
    slow = RetryPolicy("backoff", max_attempts=3, base=30.0, cap=30.0)  # waits 0..30 s
    first = OrderedConsumer(
        ordered, blocked, first_store, OrderedConfig(names, retry=slow), uniform=lambda a, b: b
    )
    thread = threading.Thread(target=first.run, daemon=True)
    thread.start()
    second_store = open_store(str(tmp_path / "s.db"))
    handler = Recorder()
    standby = OrderedConsumer(ordered, handler, second_store, OrderedConfig(names, idle_exit=8))
    try:
        wait_for(lambda: blocked.calls == ["a-1"], 20, what="the first worker ran a-1 once")
        standby_thread = threading.Thread(target=standby.run, daemon=True)
        standby_thread.start()
        wait_for(
            lambda: all(consumer_count(ordered, q) == 2 for q in names.shard_queues),
            20,
            what="both workers subscribed to every shard",
        )
        assert handler.calls == []  # the standby stands by
        first.stop()
        thread.join(10)
        standby_thread.join(30)
    finally:
        first_store.close()
        second_store.close()
    assert [i for i, _, _ in effects(tmp_path / "s.db")] == [f"a-{s}" for s in range(1, 6)]


def test_publish_and_worker_scripts_run_the_ordered_variant(
    ordered: BrokerSettings, tmp_path: Path
) -> None:
    refused = run_script(ordered, "publish.py", "--ordered", "4", "--count", "1")
    assert refused.returncode == 2 and "--key KEY or --keys K" in refused.stderr
    sent = run_script(ordered, "publish.py", "--ordered", "4", "--keys", "3", "--count", "6")
    assert sent.returncode == 0, sent.stdout + sent.stderr
    busy = run_script(ordered, "worker.py", "--ordered", "4", "--concurrency", "2")
    assert busy.returncode == 2 and "does not take --concurrency" in busy.stderr
    plain = run_script(ordered, "worker.py", "--after-dead-letter", "park")
    assert plain.returncode == 2 and "is for the ordered topology" in plain.stderr
    rows = run_worker(ordered, tmp_path, "--ordered", "4")
    assert [r["outcome"] for r in rows if "outcome" in r] == ["processed"] * 6
    assert (
        sum(ready_count(ordered, q) for q in with_ordered(load_topology(), 4).names.shard_queues)
        == 0
    )


def test_a_stopping_worker_hands_its_shard_over_in_order(vhost: BrokerSettings) -> None:
    """drop_connection ends a connection like a crash: the broker requeues what it held at
    its positions before the standby becomes active. A graceful close would basic.cancel
    first, and pika hands back the deliveries it buffered (basic.nack) before the channel's
    unacked ones: the standby got 4 before 1, 2, 3 (RabbitMQ 4.3.6, classic and quorum)."""
    import pika

    from amqp_lab.connection import connect, drop_connection

    holder, standby = connect(vhost), connect(vhost)
    try:
        channel = holder.channel()
        channel.queue_declare("sac", durable=True, arguments={"x-single-active-consumer": True})
        for n in (1, 2, 3):
            channel.basic_publish("", "sac", str(n).encode())
        held: list[bytes] = []
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume("sac", lambda _c, _m, _p, body: held.append(body))
        wait_for(lambda: holder.process_data_events(0.1) or len(held) == 3, 10, what="held")
        other = standby.channel()
        other.basic_qos(prefetch_count=10)
        got: list[bytes] = []
        other.basic_consume("sac", lambda _c, _m, _p, body: got.append(body))
        standby.process_data_events(0.5)
        other.basic_publish("", "sac", b"4", pika.BasicProperties())
        standby.process_data_events(0.5)  # 4 reaches the holder's buffer, not its callback
        drop_connection(holder)
        assert not holder.is_open
        wait_for(lambda: standby.process_data_events(0.1) or len(got) == 4, 10, what="takeover")
        assert got == [b"1", b"2", b"3", b"4"]
    finally:
        standby.close()


def test_hostile_deliveries_go_to_the_dlq_and_their_key_runs_on(
    ordered: BrokerSettings, tmp_path: Path
) -> None:
    """No message_id, a body that is not JSON, a key header that is not a string: each is
    dead-lettered with its reason (never acked unrun), and the key's next message runs."""
    import pika

    from amqp_lab.connection import connect

    connection = connect(ordered)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        json_type = "application/json"
        for message_id, body, headers in [
            (None, b'{"key": "a", "seq": 1}', {"key": "a"}),
            ("a-2", b"{not json", {"key": "a"}),
            ("a-3", b'{"key": "a", "seq": 3}', {"key": 7}),  # falls back to the routing key
        ]:
            properties = pika.BasicProperties(
                message_id=message_id, content_type=json_type, headers=headers, delivery_mode=2
            )
            channel.basic_publish("tasks.ordered", "a", body, properties, mandatory=True)
    finally:
        connection.close()
    publish_keys(ordered, [("a", 4)])
    run_consumer(ordered, Recorder(), tmp_path / "s.db")
    records = browse(ordered, "q:tasks:dlq")
    assert [(e.message_id, e.error_type) for e in records] == [
        (None, "InvalidMessage"),
        ("a-2", "InvalidMessage"),
    ]
    assert [i for i, _, _ in effects(tmp_path / "s.db")] == ["a-3", "a-4"]


def test_in_worker_retries_of_a_redelivered_message_are_not_counted_as_poison(
    ordered: BrokerSettings, tmp_path: Path
) -> None:
    """max_redeliveries counts the broker's redeliveries; a redelivered message that fails
    transiently and is retried in the worker is not declared poison by those retries."""
    from amqp_lab.connection import connect

    publish_keys(ordered, [("a", 1)])
    shard = next(
        q for q in with_ordered(load_topology(), 4).names.shard_queues if ready_count(ordered, q)
    )
    connection = connect(ordered)  # take it and vanish: the broker redelivers it
    channel = connection.channel()
    method, _, _ = channel.basic_get(shard)
    assert method is not None
    connection.close()
    handler = Recorder({"a-1": [TransientError] * 3})
    run_consumer(ordered, handler, tmp_path / "s.db", max_redeliveries=1, retry=FIVE)
    assert handler.calls == ["a-1"] * 4
    assert [i for i, _, _ in effects(tmp_path / "s.db")] == ["a-1"]
    assert browse(ordered, "q:tasks:dlq") == []


def test_a_channel_the_broker_closes_while_a_key_is_held_ends_in_a_reconnect(
    ordered: BrokerSettings, tmp_path: Path
) -> None:
    """Up to 4.2 a consumer timeout closes the channel (406) while the worker holds a key:
    the broker has the deliveries back, so the worker must not go on running them there. A
    406 is provoked by acking an unknown delivery tag on the consuming channel."""
    publish_keys(ordered, [("a", 1), ("a", 2), ("a", 3)])
    names = with_ordered(load_topology(), shards=4).names
    store = open_store(str(tmp_path / "s.db"))
    handler = Recorder({"a-1": [TransientError]})
    provoked: list[bool] = []

    outcomes: list[tuple[str, str]] = []

    def on_report(report: Any) -> None:
        outcomes.append((report.message_id, report.outcome))
        if report.outcome == "retried" and not provoked:  # issue 23: was held
            provoked.append(True)
            consumer._lines.head("a")[0].basic_ack(999999)  # 406 PRECONDITION_FAILED

    config = OrderedConfig(names, retry=RetryPolicy("backoff", 3, 0.5, 0.5), idle_exit=1.5)
    consumer = OrderedConsumer(ordered, handler, store, config, on_report=on_report)
    try:
        consumer.run()
    finally:
        store.close()
    assert provoked and consumer.connections_opened >= 2
    assert [i for i, _, _ in effects(tmp_path / "s.db")] == ["a-1", "a-2", "a-3"]
    # a-1 ran again only once it was redelivered on the new connection, not on the dead
    # channel (that run would have committed, and the redelivery been a duplicate)
    assert outcomes == [
        ("a-1", "retried"),
        ("a-1", "processed"),
        ("a-2", "processed"),
        ("a-3", "processed"),
    ]


def test_a_dlq_that_refuses_the_record_stops_the_worker_and_keeps_the_key_in_its_shard(
    ordered: BrokerSettings, tmp_path: Path
) -> None:
    """Unlike the plain consumer (which parks the delivery and goes on), the ordered one
    stops: running a-2 without a-1's record in the DLQ would break a's order."""
    from amqp_lab.connection import connect
    from amqp_lab.errors import DeadLetterFailed

    publish_keys(ordered, [("a", 1), ("a", 2)])
    connection = connect(ordered)
    connection.channel().exchange_delete("tasks.dlx")  # the record is unroutable (404)
    connection.close()
    handler = Recorder({"a-1": [BusinessError]})
    with pytest.raises(DeadLetterFailed, match="not confirmed"):
        run_consumer(ordered, handler, tmp_path / "s.db")
    assert handler.calls == ["a-1"]  # a-2 never ran
    shards = with_ordered(load_topology(), 4).names.shard_queues
    wait_for(lambda: sum(ready_count(ordered, q) for q in shards) == 2, 10, what="both back")
