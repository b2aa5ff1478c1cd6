"""Bounded replays on a real broker: a replay, a selective replay, a delete and a console group
action of more records than the window hold at most the window unacked (counted on the channel
and read from the management API), move what they do not select to the DLQ's tail exactly as it
was (raw x-death entries included) and leave it in order; a channel the broker closes mid-replay
(a consumer timeout) loses nothing, and a hold below that timeout gets through."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqp_lab.connection import open_channel
from amqp_lab.console import create_app
from amqp_lab.dlq.fingerprint import group
from amqp_lab.dlq.ops import browse, delete, replay
from amqp_lab.dlq.record import build_record, record_message
from amqp_lab.dlq.summary import Selection
from amqp_lab.dlq.window import PassReport, exact_properties
from amqp_lab.errors import AmqpLabError, BusinessError, ConnectionLost
from amqp_lab.message import encode_json
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, with_queue_type
from lab.handler import task_message
from tests.brokers import TestBroker
from tests.support import NAMES, get_all, run_script, wait_for, wait_ready_count

pytestmark = [
    pytest.mark.integration,
    pytest.mark.failure_model,
    pytest.mark.no_plain_consumer,
    pytest.mark.timeout(180),
]


def fill(settings: BrokerSettings, specs: Sequence[tuple[str, BaseException, str]]) -> None:
    """DLQ records (message_id, error, key) with confirms, a second apart, in this order."""
    now = time.time() - len(specs)
    with Publisher(settings) as publisher:
        for seq, (message_id, error, key) in enumerate(specs):
            record = build_record(
                body=encode_json({"kind": "ok", "seq": seq}),
                message_id=message_id,
                exchange=NAMES.exchange,
                routing_key=NAMES.routing_key,
                queue=NAMES.queue,
                properties={"content_type": "application/json"},
                headers={"attempts": 1, "key": key},
                error=error,
                classification="business" if isinstance(error, BusinessError) else "unknown",
                attempts=1,
                first_seen_at="2026-01-01T00:00:00.000Z",
                failed_at=now + seq,
            )
            publisher.publish(record_message(record, NAMES.dead_letter_exchange, "task"))


def reject_one(settings: BrokerSettings, message_id: str) -> None:
    """A raw DLQ entry with x-death: published to q:tasks, then basic.reject(requeue=False)."""
    with Publisher(settings) as publisher:
        publisher.publish(task_message("ok", 0, message_id))
    with open_channel(settings) as channel:
        method, _, _ = channel.basic_get(NAMES.queue, auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=False)


def raw_dlq(settings: BrokerSettings) -> list[tuple[str, bytes, bytes]]:
    """(message_id, encoded properties, body) of every DLQ message in order, left in place."""
    seen = []
    with open_channel(settings) as channel:
        while True:
            method, props, body = channel.basic_get(NAMES.dlq, auto_ack=False)
            if method is None:
                break
            seen.append((props.message_id, b"".join(exact_properties(props).encode()), body))
        channel.basic_nack(0, multiple=True, requeue=True)
        channel.queue_declare(NAMES.dlq, passive=True)
    return seen


@contextmanager
def unacked_samples(broker: TestBroker, settings: BrokerSettings) -> Iterator[list[int]]:
    """The DLQ's unacknowledged messages as the broker counts them, read meanwhile again and
    again with ``rabbitmqctl list_queues`` (the queue process's own count, not the management
    statistics, which lag by seconds)."""
    if broker.ctl_fn is None:
        pytest.skip("the broker came from EAI_AMQP_URL: the tests cannot run rabbitmqctl")
    samples: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            listed = broker.ctl(
                "list_queues", "-p", settings.vhost, "name", "messages_unacknowledged",
                "--no-table-headers", "--quiet",
            )  # fmt: skip
            for line in listed.splitlines():
                name, _, count = line.strip().rpartition("\t")
                if name == NAMES.dlq and count.isdigit():
                    samples.append(int(count))

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(10)


def ids_in(settings: BrokerSettings, queue: str) -> list[str]:
    return [props.message_id for _, props, _ in get_all(settings, queue)]


def test_a_replay_of_more_records_than_the_window_holds_the_window(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    ids = [f"m-{i:02d}" for i in range(40)]
    fill(topology, [(i, RuntimeError("bug"), "k") for i in ids])
    wait_ready_count(topology, NAMES.dlq, 40)
    audit = tmp_path / "audit.jsonl"
    with unacked_samples(broker, topology) as samples:
        started = time.monotonic()
        result = run_script(
            topology, "replay.py", "--all", "--window", "8", "--rate", "16",
            "--audit-log", str(audit), timeout=120,
        )  # fmt: skip
        took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "40 selected, 40 replayed, 0 failed"
    assert "40 records at the start, 40 examined, 0 moved" in result.stderr
    assert "at most 8 held at once" in result.stderr
    assert took > 2.0  # 40 at 16/s: the windows really were held for a while
    assert max(samples) <= 8 and any(samples), samples  # the broker's own count
    assert ids_in(topology, NAMES.queue) == ids  # every one, in DLQ order
    assert [json.loads(line)["message_id"] for line in audit.read_text().splitlines()] == ids
    wait_ready_count(topology, NAMES.dlq, 0)


def test_a_selective_replay_moves_what_it_skips_exactly_and_in_order(
    topology: BrokerSettings,
) -> None:
    """Key ``a`` (5 of 30 records, and a raw x-death entry among the rest): window 4, so the
    pass must get past 25 records it does not select; replayed in order, the rest unchanged."""
    specs = [(f"r-{i:02d}", RuntimeError("bug"), "a" if i % 6 == 1 else "b") for i in range(30)]
    fill(topology, specs[:10])
    reject_one(topology, "raw-1")  # in the middle of the DLQ, carrying x-death
    fill(topology, specs[10:])
    wait_ready_count(topology, NAMES.dlq, 31)
    before = raw_dlq(topology)
    assert [m for m, _, _ in before][10] == "raw-1" and b"x-death" in before[10][1]
    reports: list[PassReport] = []
    results = replay(
        topology, Selection(key="a").matches, queue=NAMES.dlq, window=4, in_order=True,
        on_pass=reports.append,
    )  # fmt: skip
    wanted = [m for m, _, key in specs if key == "a"]
    assert [(r.entry.message_id, r.status) for r in results] == [(m, "replayed") for m in wanted]
    assert ids_in(topology, NAMES.queue) == wanted
    (report,) = reports
    assert (report.depth, report.examined, report.removed) == (31, 31, 5)
    assert report.moved == 26 and report.max_unacked == 4 and report.depth_after == 26
    after = raw_dlq(topology)
    assert after == [m for m in before if m[0] not in wanted]  # byte for byte, in order


def test_a_delete_of_more_records_than_the_window(topology: BrokerSettings) -> None:
    specs = [
        (f"d-{i:02d}", BusinessError("no") if i % 3 == 0 else RuntimeError("bug"), "k")
        for i in range(25)
    ]
    fill(topology, specs)
    wait_ready_count(topology, NAMES.dlq, 25)
    reported: list[str] = []
    reports: list[PassReport] = []
    results = delete(
        topology,
        lambda e: e.error_type == "BusinessError",
        queue=NAMES.dlq,
        window=4,
        on_result=lambda r: reported.append(str(r.entry.message_id)),
        on_pass=reports.append,
    )
    gone = [m for m, error, _ in specs if isinstance(error, BusinessError)]
    assert [r.entry.message_id for r in results] == reported == gone
    assert {r.status for r in results} == {"deleted"}
    assert reports[0].max_unacked == 4 and reports[0].moved == 25 - len(gone)
    assert [e.message_id for e in browse(topology, NAMES.dlq)] == [
        m for m, _, _ in specs if m not in gone
    ]


@pytest.fixture
def console_user(broker: TestBroker, topology: BrokerSettings) -> Iterator[Callable[[str], Any]]:
    """``console_user(write)``: settings of a new user with no tags, read on the DLQ only and
    ``write`` as its write permission."""
    made: list[str] = []

    def make(write: str) -> BrokerSettings:
        name, password = f"console-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
        with broker.admin() as api:
            api.create_user(name, password, tags="")
            api.set_permissions(
                topology.vhost, name, configure="^$", write=write, read="^q:tasks:dlq$"
            )
        made.append(name)
        path = quote(topology.vhost, safe="")
        return BrokerSettings(f"amqp://{name}:{password}@{topology.host}:{topology.port}/{path}")

    yield make
    with broker.admin() as api:
        for name in made:
            api.delete_user(name)


def test_a_console_group_action_holds_a_window(
    broker: TestBroker,
    topology: BrokerSettings,
    console_user: Callable[[str], BrokerSettings],
    tmp_path: Path,
) -> None:
    """A least-privileged console user replays one group of 4 among 16 records, window 3.
    Without write on the default exchange the move is refused: nothing lost, one error page."""
    specs = [
        (f"c-{i:02d}", BusinessError("no customer") if i % 4 == 2 else RuntimeError("bug"), "k")
        for i in range(16)
    ]
    fill(topology, specs)
    wait_ready_count(topology, NAMES.dlq, 16)
    groups = group(browse(topology, NAMES.dlq))
    (chosen,) = [g for g in groups if g.fingerprint.error_type == "BusinessError"]
    ids = [str(e.message_id) for e in chosen.entries]

    def app_for(settings: BrokerSettings) -> Any:
        app = create_app(settings, NAMES, token=None, audit_log=tmp_path / "audit.jsonl")
        app.testing = True
        app.config["AMQP_LAB_ACTIONS"].window = 3
        return app

    refused = app_for(console_user(f"^{NAMES.exchange}$"))
    form = {"csrf": refused.config["AMQP_LAB_CSRF"], "message_id": ids, "rate": "20"}
    page = refused.test_client().post(f"/group/{chosen.id}/replay", data=form)
    assert page.status_code == 502 and "amq.default" in page.get_data(as_text=True)
    wait_ready_count(topology, NAMES.dlq, 16 - 1)  # the first record of the group went out
    allowed = app_for(console_user(rf"^({NAMES.exchange}|amq\.default)$"))
    form["csrf"] = allowed.config["AMQP_LAB_CSRF"]
    with unacked_samples(broker, topology) as samples:
        done = allowed.test_client().post(f"/group/{chosen.id}/replay", data=form)
    assert done.status_code == 200, done.get_data(as_text=True)
    assert re.search(r"3 records replayed", done.get_data(as_text=True))
    assert max(samples) <= 3, samples
    assert sorted(ids_in(topology, NAMES.queue)) == ids
    assert [e.message_id for e in browse(topology, NAMES.dlq)] == [
        m for m, _, _ in specs if m not in ids
    ]


@pytest.fixture
def quorum_dlq_timeout(broker: TestBroker, vhost: BrokerSettings) -> Iterator[BrokerSettings]:
    """The quorum topology (a quorum DLQ: basic.get deliveries time out there on 3.10, 4.0 and
    4.3 alike) with the broker's consumer_timeout at 2 s, checked every 500 ms; restored."""
    if broker.ctl_fn is None:
        pytest.skip("the broker came from EAI_AMQP_URL: the tests cannot change consumer_timeout")
    apply_topology(vhost, with_queue_type(load_topology(), "quorum"))
    broker.ctl("eval", "application:set_env(rabbit, consumer_timeout, 2000).")
    broker.ctl("eval", "application:set_env(rabbit, channel_tick_interval, 500).")
    try:
        yield vhost
    finally:
        broker.ctl("eval", "application:set_env(rabbit, consumer_timeout, 1800000).")
        broker.ctl("eval", "application:set_env(rabbit, channel_tick_interval, 60000).")


def test_a_channel_closed_mid_replay_loses_nothing(quorum_dlq_timeout: BrokerSettings) -> None:
    """Held past the consumer timeout, the DLQ channel is closed by the broker: the replay stops
    with an error, what was replayed stays replayed, the rest is back in the DLQ. Run again
    with a hold below the timeout, the replay outlasts it and finishes; a record replayed twice
    (its ack lost with the channel) is a duplicate the consumer's dedup absorbs."""
    settings = quorum_dlq_timeout
    ids = [f"t-{i:02d}" for i in range(20)]
    fill(settings, [(i, RuntimeError("bug"), "k") for i in ids])
    wait_ready_count(settings, NAMES.dlq, 20)
    first: list[str] = []
    with pytest.raises(AmqpLabError) as closed:
        replay(settings, lambda e: True, queue=NAMES.dlq, rate=4, window=20, max_hold=30,
               on_result=lambda r: first.append(str(r.entry.message_id)))  # fmt: skip
    assert "406" in str(closed.value) or "timed out" in str(closed.value), closed.value
    assert 2 <= len(first) <= 12  # about 2 s at 4 per second
    sent = ids_in(settings, NAMES.queue)
    left = [str(e.message_id) for e in browse(settings, NAMES.dlq)]
    assert sorted(sent) == sorted(first) and set(sent) | set(left) == set(ids)  # none lost
    twice = set(sent) & set(left)  # replayed (and audited), its ack lost with the channel
    assert len(twice) <= 1, twice
    started = time.monotonic()
    second = replay(settings, lambda e: True, queue=NAMES.dlq, rate=4, max_hold=1.0)
    assert time.monotonic() - started > 2.0  # longer than the timeout, in windows below it
    assert [(str(r.entry.message_id), r.status) for r in second] == [(m, "replayed") for m in left]
    wait_ready_count(settings, NAMES.dlq, 0)


def test_a_connection_closed_mid_replay_loses_nothing(
    broker: TestBroker, topology: BrokerSettings
) -> None:
    """rabbitmqctl close_all_connections while a replay holds a window: ConnectionLost, what
    was replayed stays replayed, the rest (the record in flight at most twice) is in the DLQ."""
    if broker.ctl_fn is None:
        pytest.skip("the broker came from EAI_AMQP_URL: the tests cannot run rabbitmqctl")
    ids = [f"x-{i:02d}" for i in range(16)]
    fill(topology, [(i, RuntimeError("bug"), "k") for i in ids])
    wait_ready_count(topology, NAMES.dlq, 16)
    done: list[str] = []
    ended: list[BaseException] = []

    def run() -> None:
        try:
            # 2 a second: the 13 records left take 6.5 s, longer than rabbitmqctl under CI
            # load takes to close the connection (at 8 a second CI saw the replay finish first)
            replay(topology, lambda e: True, queue=NAMES.dlq, rate=2,
                   on_result=lambda r: done.append(str(r.entry.message_id)))  # fmt: skip
        except BaseException as e:
            ended.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: len(done) >= 3, 20, what="three records replayed")
    broker.ctl("close_all_connections", "-p", topology.vhost, "closed by the test")
    thread.join(30)
    assert not thread.is_alive() and len(ended) == 1
    assert isinstance(ended[0], ConnectionLost), ended[0]
    assert 3 <= len(done) < 16
    sent = ids_in(topology, NAMES.queue)
    left = [str(e.message_id) for e in browse(topology, NAMES.dlq)]
    # (the publisher's own connection was closed too: a publish it retried may be there twice)
    assert set(sent) == set(done) and set(sent) | set(left) == set(ids)
    assert len(set(sent) & set(left)) <= 1
