"""The failure model, class by class, on the real broker: every way the broker, the store or the
wire can end a worker's work has one outcome (docs/failure-model.md names these tests).

Consumer lifecycle: broker cancel, missing queue, vhost/credentials/permissions gone,
connect-then-die, undecodable and unsettleable deliveries, a handler that kills the process,
SIGTERM/SIGINT drain, the dedup store lost. Then the retry topology check and what
``mandatory`` cannot see.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.errors import BrokerConnectionError, BusinessError
from amqp_lab.fieldtable import TaggedInt
from amqp_lab.message import Task, encode_json
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology
from lab.handler import CRASH_EXIT_CODE, lab_handler, task_message
from tests.brokers import TestBroker
from tests.faultproxy import FaultProxy
from tests.support import (
    TEST_CONCURRENCY,
    consumer_config,
    consumer_count,
    get_all,
    lab_message,
    lines_for,
    one_error_line,
    parse_lines,
    publish,
    ready_count,
    run_script,
    run_worker,
    settled_order,
    start_script,
    through,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]


def effects(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return sorted(r[0] for r in db.execute("SELECT message_id FROM effects"))


def worker(settings: BrokerSettings, tmp_path: Path, *args: str) -> Any:
    return start_script(
        settings, "worker.py", "--dedup-path", str(tmp_path / "dedup.sqlite3"), *args
    )


def finish(proc: Any, timeout: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


class Running:
    """A Consumer running in a thread; ``error`` is what run() raised, ``result`` what it
    returned."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.error: BaseException | None = None
        self.result: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.consumer.run()
        except BaseException as e:
            self.error = e

    def join(self, timeout: float = 60) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the consumer did not end"


# --- the broker cancels the consumer ----------------------------------------------------------
@pytest.mark.timeout(90)
def test_broker_cancel_resubscribes_when_the_queue_comes_back(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """The queue deleted and recreated under a running consumer: basic.cancel, then the
    consumer resubscribes to the new queue and goes on."""
    reports: list[DeliveryReport] = []
    consumer = Consumer(
        topology,
        lab_handler,
        SqliteDedupStore(tmp_path / "d.sqlite3"),
        consumer_config(resubscribe_wait=30),
        on_report=reports.append,
    )
    running = Running(consumer)
    publish(topology, ("ok", "before"))
    wait_for(lambda: [r.message_id for r in reports] == ["before"], what="first processed")
    with open_channel(topology) as channel:
        channel.queue_delete("q:tasks")
    apply_topology(topology, load_topology())  # recreated, bound again
    wait_for(lambda: consumer_count(topology, "q:tasks") == 1, what="resubscribed")
    publish(topology, ("ok", "after"))
    wait_for(lambda: len(reports) == 2, what="second processed")
    consumer.stop()
    running.join()
    assert running.error is None and running.result == 2
    assert [(r.message_id, r.outcome) for r in reports] == [
        ("before", "processed"),
        ("after", "processed"),
    ]
    assert consumer.connections_opened == 2


@pytest.mark.timeout(60)
def test_broker_cancel_without_the_queue_coming_back_is_fatal_and_names_it(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    proc = worker(topology, tmp_path, "--resubscribe-wait", "2")
    wait_for(lambda: consumer_count(topology, "q:tasks") == 1, what="worker subscribed")
    with open_channel(topology) as channel:
        channel.queue_delete("q:tasks")
    code, out, err = finish(proc, 30)
    assert code == 1, out + err
    assert one_error_line(err) == (
        f"error: queue 'q:tasks' in vhost '{topology.vhost}' is gone (the broker cancelled the "
        "consumer) and did not come back within 2 s"
    )
    assert "worker stopped" not in out  # never reported as done


# --- the queue is missing at start ------------------------------------------------------------
@pytest.mark.timeout(60)
def test_missing_queue_at_start_fails_within_seconds_naming_queue_vhost_and_fix(
    vhost: BrokerSettings, tmp_path: Path
) -> None:
    started = time.monotonic()
    result = run_script(vhost, "worker.py", "--dedup-path", str(tmp_path / "d.sqlite3"))
    assert time.monotonic() - started < 10
    assert result.returncode == 1
    assert result.stderr == (
        f"error: queue 'q:tasks' does not exist in vhost '{vhost.vhost}': declare it "
        "(scripts/setup_topology.py --topology FILE, or amqp-lab-topology, applies a topology), "
        "or wait for it (--wait-for-queue SECONDS)\n"
    )


@pytest.mark.timeout(60)
def test_wait_for_queue_consumes_once_the_queue_appears(
    vhost: BrokerSettings, tmp_path: Path
) -> None:
    # idle-exit counts from the subscription: long enough for the topology and the publish
    # below on a loaded machine (6 s was not, under four xdist workers)
    proc = worker(vhost, tmp_path, "--wait-for-queue", "30", "--idle-exit", "20")
    time_to_fail = 3  # a worker that did not wait would have exited by now
    with pytest.raises(Exception, match="timed out"):
        proc.wait(time_to_fail)
    apply_topology(vhost, load_topology())
    publish(vhost, ("ok", "m-late"))
    code, out, err = finish(proc)
    assert code == 0, err
    assert lines_for(parse_lines(out), "m-late") == [("processed", "1", "false")]


# --- the vhost, the credentials or the permissions go away mid-run ------------------------------
@pytest.mark.timeout(60)
def test_vhost_deleted_mid_run_exits_1_with_one_line(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    proc = worker(topology, tmp_path)
    wait_for(lambda: consumer_count(topology, "q:tasks") == 1, what="worker subscribed")
    with broker.admin() as api:
        api.delete_vhost(topology.vhost)
    code, _out, err = finish(proc, 30)
    assert code == 1
    line = one_error_line(err)
    assert f"vhost '{topology.vhost}'" in line and "refused" in line, line


def _limited_user(broker: TestBroker, settings: BrokerSettings) -> tuple[str, str, BrokerSettings]:
    user, password = f"w-{uuid.uuid4().hex[:8]}", "w-S3cret-7"
    with broker.admin() as api:
        api.create_user(user, password, tags="management")  # the worker reads its DLQ's policy
        api.set_permissions(settings.vhost, user)
    url = settings.amqp_url.replace(f"{broker.username}:{broker.password}@", f"{user}:{password}@")
    return user, password, BrokerSettings(url, settings.management_url)


@pytest.mark.timeout(60)
def test_credentials_revoked_mid_run_exit_1_without_the_password(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    """Deleting the user closes its connections (320); the reconnect is refused (403)."""
    user, password, limited = _limited_user(broker, topology)
    try:
        proc = worker(limited, tmp_path)
        wait_for(lambda: consumer_count(topology, "q:tasks") == 1, what="worker subscribed")
        with broker.admin() as api:
            api.delete_user(user)
        code, out, err = finish(proc, 30)
    finally:
        with broker.admin() as api:
            api.delete_user(user)
    assert code == 1
    assert one_error_line(err).startswith("error: authentication failed at amqp://")
    assert password not in out + err


@pytest.mark.timeout(60)
def test_permissions_revoked_mid_run_exit_1_at_the_first_refused_write(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    """RabbitMQ keeps delivering to a consumer whose permissions were cleared (checked on 3.10
    and 4.0); the first write it refuses - here a DLQ record - ends the worker, and the
    message it was for goes back to the queue."""
    user, _, limited = _limited_user(broker, topology)
    try:
        proc = worker(limited, tmp_path)
        wait_for(lambda: consumer_count(topology, "q:tasks") == 1, what="worker subscribed")
        with broker.admin() as api:
            api.delete_permissions(topology.vhost, user)
        publish(topology, ("invalid", "m-refused"))
        code, out, err = finish(proc, 30)
    finally:
        with broker.admin() as api:
            api.delete_user(user)
    assert code == 1
    assert "ACCESS_REFUSED" in one_error_line(err)
    assert "outcome=dead-lettered" not in out
    wait_for(lambda: ready_count(topology, "q:tasks") == 1, what="the message back in q:tasks")


# --- connect-then-die -------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_connections_that_die_before_settling_anything_exhaust_the_budget(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Each connection opens (the AMQP handshake completes), then dies before it settles
    anything: the consumer gives up after ``reconnect_attempts`` such connections instead of
    looping forever."""
    with FaultProxy((topology.host, topology.port)) as proxy:
        stop = threading.Event()

        def cut_each_connection() -> None:
            while not stop.is_set():
                if proxy.open_connections:
                    time.sleep(0.5)
                    proxy.cut()
                time.sleep(0.05)

        threading.Thread(target=cut_each_connection, daemon=True).start()
        consumer = Consumer(
            through(topology, proxy.port),
            lab_handler,
            SqliteDedupStore(tmp_path / "d.sqlite3"),
            consumer_config(reconnect_attempts=3),
        )
        started = time.monotonic()
        with pytest.raises(BrokerConnectionError, match="gave up after 3 connections in a row"):
            consumer.run()  # an empty queue: no connection ever settles anything
        stop.set()
    assert consumer.connections_opened == 3
    assert time.monotonic() - started < 30


@pytest.mark.timeout(90)
def test_a_dlq_write_whose_confirm_does_not_come_drops_the_consumers_connection(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """The consumer's DLQ write waits confirm_timeout, not until the link comes back: the
    connection is dropped, the delivery comes back on the next one and is dead-lettered
    there (a record of the first write may have been stored too: at least once)."""
    publish(topology, ("ok", "m-dlq"))
    with FaultProxy((topology.host, topology.port)) as proxy:
        stalls: list[threading.Thread] = []

        def handler(task: Task, db: Any) -> None:
            if not stalls:  # the link goes silent as the DLQ write starts (heartbeats: 60 s)
                stalls.append(threading.Thread(target=proxy.stall, args=(6,), daemon=True))
                stalls[0].start()
            raise BusinessError("refused: the DLQ write is what is tested")

        reports: list[DeliveryReport] = []
        consumer = Consumer(
            through(topology, proxy.port, heartbeat=60),
            handler,
            SqliteDedupStore(tmp_path / "d.sqlite3"),
            consumer_config(idle_exit=2.0, confirm_timeout=1.5),
            on_report=reports.append,
        )
        consumer.run()
        stalls[0].join(10)
    assert consumer.connections_opened == 2  # without the deadline: 1, the write waits 6 s
    assert [(r.message_id, r.outcome) for r in reports] == [("m-dlq", "dead-lettered")]
    records = [p.message_id for _, p, _ in get_all(topology, "q:tasks:dlq")]
    assert 1 <= len(records) <= 2
    assert get_all(topology, "q:tasks") == []


# --- deliveries the client cannot decode or settle ---------------------------------------------
@pytest.mark.timeout(60)
def test_headers_pika_cannot_decode_no_longer_kill_the_worker(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """A timestamp header past year 9999 (RabbitMQ accepts it) killed pika's frame decoder on
    every delivery, so every worker died in turn. Now it decodes losslessly, is processed, and
    the queue behind it flows."""
    hostile = lab_message(
        body=encode_json({"kind": "ok", "seq": 1}),
        message_id="m-hostile",
        headers={"t": TaggedInt(2**63, "T"), "f": 1.5, "attempts": 0},
    )
    with Publisher(topology) as publisher:
        publisher.publish(hostile)
        for i in range(3):
            publisher.publish(task_message("ok", i, f"m-{i}"))
    rows = run_worker(topology, tmp_path)
    assert [(r["message_id"], r["outcome"]) for r in rows] == [
        ("m-hostile", "processed"),
        ("m-0", "processed"),
        ("m-1", "processed"),
        ("m-2", "processed"),
    ]


@pytest.mark.timeout(60)
def test_headers_that_broke_the_record_builder_reach_the_dlq(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """Decimal, timestamp, bytes nested in a table: the DLQ record used to fail to encode
    (TypeError), killing the worker on every redelivery."""
    exotic = {"d": Decimal("1.50"), "when": datetime(2026, 1, 2, tzinfo=UTC), "n": {"b": b"\xff"}}
    message = lab_message(
        body=encode_json({"kind": "invalid", "seq": 1}),
        message_id="m-exotic",
        headers=exotic,
    )
    with Publisher(topology) as publisher:
        publisher.publish(message)
        publisher.publish(task_message("ok", 2, "m-after"))
    rows = run_worker(topology, tmp_path)
    assert [(r["message_id"], r["outcome"]) for r in rows] == [
        ("m-exotic", "dead-lettered"),
        ("m-after", "processed"),
    ]
    (record,) = get_all(topology, "q:tasks:dlq")
    assert record[1].message_id == "m-exotic"


@pytest.mark.timeout(90)
def test_a_delivery_the_dlq_will_not_take_is_parked_and_the_rest_flows(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """The DLQ unreachable (its binding removed): the failing delivery is parked (left unacked)
    after bounded tries, the good ones behind it are processed, the worker exits 1 at the end
    naming the cause, and the parked message is back in the queue for the next run."""
    with open_channel(topology) as channel:
        channel.queue_unbind("q:tasks:dlq", "tasks.dlx", routing_key="")
    publish(topology, ("invalid", "m-stuck"), ("ok", "m-1"), ("ok", "m-2"))
    proc = worker(topology, tmp_path, "--idle-exit", "1.5")
    code, out, err = finish(proc)
    assert code == 1
    assert [(r["message_id"], r["outcome"]) for r in parse_lines(out)] == [
        ("m-stuck", "parked"),
        ("m-1", "processed"),
        ("m-2", "processed"),
    ]
    line = one_error_line(err)
    assert "1 deliveries could not be dead-lettered" in line and "returned unroutable" in line
    wait_for(lambda: ready_count(topology, "q:tasks") == 1, what="the parked message back")
    with open_channel(topology) as channel:
        channel.queue_bind("q:tasks:dlq", "tasks.dlx", routing_key="")
    rows = run_worker(topology, tmp_path)
    assert [(r["message_id"], r["outcome"]) for r in rows] == [("m-stuck", "dead-lettered")]
    assert ready_count(topology, "q:tasks:dlq") == 1


# --- a handler that kills the process ---------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_message_that_kills_the_worker_is_dead_lettered_after_bounded_redeliveries(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """os._exit in the handler (a segfault, the OOM killer): each restart gets the message
    again. The store commits a redelivery count before each handler run; past
    --max-redeliveries it goes to the DLQ unrun, and the messages behind it are processed."""
    publish(topology, ("crash", "m-crash"), ("ok", "m-1"), ("ok", "m-2"))
    codes: list[int] = []
    out = ""  # every run's reports: with several handlers m-1 and m-2 may commit in the first
    while not codes or codes[-1] != 0:
        assert len(codes) < 6, f"crash loop: exit codes {codes}"
        args = ("--max-redeliveries", "2", "--idle-exit", "1.5")
        code, run_out, _ = finish(worker(topology, tmp_path, *args))
        codes.append(code)
        out += run_out
    assert codes == [CRASH_EXIT_CODE] * 3 + [0]  # first delivery, 2 redeliveries, then the DLQ
    reports = [(r["message_id"], r["outcome"]) for r in parse_lines(out)]
    if TEST_CONCURRENCY == 1:
        assert reports == [("m-crash", "dead-lettered"), ("m-1", "processed"), ("m-2", "processed")]
    else:
        # With several handlers m-1 or m-2 can commit in a run the crash kills before its
        # basic.ack leaves: the next run finds the claim and settles it as a duplicate. Each
        # must still be settled, and applied once (the effects below).
        assert reports.count(("m-crash", "dead-lettered")) == 1
        for message_id in ("m-1", "m-2"):
            outcomes = [o for m, o in reports if m == message_id]
            assert outcomes and set(outcomes) <= {"processed", "duplicate"}, (message_id, reports)
        assert {m for m, _ in reports} == {"m-crash", "m-1", "m-2"}
    (_, _props, body) = get_all(topology, "q:tasks:dlq")[0]
    assert b'"type":"PoisonMessage"' in body and b'"classification":"poison"' in body
    assert effects(tmp_path / "dedup.sqlite3") == ["m-1", "m-2"]


# --- SIGTERM and SIGINT drain -----------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_drains_the_handler_in_flight_then_exits(
    topology: BrokerSettings, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    with Publisher(topology) as publisher:
        for i in range(3):
            body = encode_json({"kind": "slow", "seq": i, "seconds": 2})
            publisher.publish(lab_message(body=body, message_id=f"m-{i}"))
    proc = worker(topology, tmp_path)
    wait_for(lambda: ready_count(topology, "q:tasks") == 0, what="all three prefetched")
    proc.send_signal(sig)
    returncode, out, err = finish(proc, 30)
    assert returncode == code, err
    # in handlers at the signal: the first min(3, concurrency) prefetched, those whose handler
    # had started (on a loaded machine a handler thread may not have taken the last one yet:
    # it goes back unstarted, as a drain hands back everything not started)
    could_run = [f"m-{i}" for i in range(min(3, TEST_CONCURRENCY))]
    outcomes = settled_order([(r["message_id"], r["outcome"]) for r in parse_lines(out)])
    running = [m for m, _ in outcomes]
    assert running and set(running) <= set(could_run), outcomes
    assert outcomes == [(m, "processed") for m in running]
    assert out.splitlines()[-1] == (
        f"worker stopped ({sig.name} received): {len(running)} deliveries handled"
    )
    assert f"{sig.name}: draining" in err and "Traceback" not in err
    assert sorted(effects(tmp_path / "dedup.sqlite3")) == sorted(running)
    left = 3 - len(running)
    wait_for(lambda: ready_count(topology, "q:tasks") == left, what="the rest back in the queue")


@pytest.mark.timeout(60)
def test_a_second_signal_exits_at_once(topology: BrokerSettings, tmp_path: Path) -> None:
    with Publisher(topology) as publisher:
        body = encode_json({"kind": "slow", "seq": 0, "seconds": 10})
        publisher.publish(lab_message(body=body, message_id="m-long"))
    proc = worker(topology, tmp_path)
    wait_for(lambda: ready_count(topology, "q:tasks") == 0, what="the message in flight")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the first signal is handled (draining is not observable from outside)
    assert proc.poll() is None  # the first signal drains: the 10 s handler is still running
    proc.send_signal(signal.SIGTERM)
    returncode, out, _err = finish(proc, 30)
    assert returncode == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5  # not after the 10 s handler
    assert "outcome=" not in out  # nothing settled: it is redelivered, dedup would skip a commit
    wait_for(lambda: ready_count(topology, "q:tasks") == 1, what="the message back in the queue")


# --- writes the broker does not confirm --------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_retry_copy_the_wait_queue_will_not_take_goes_to_the_dlq_instead(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """The wait queue deleted (and the topology check switched off): the retry copy comes back
    unroutable, so the delivery is dead-lettered at once, saying why, rather than lost."""
    with open_channel(topology) as channel:
        channel.queue_delete("q:tasks:wait:1")
    publish(topology, ("bad", "m-no-wait"))
    rows = run_worker(
        topology, tmp_path, "--retry", "backoff", "--max-attempts", "3", "--no-verify-topology"
    )
    assert [(r["message_id"], r["outcome"]) for r in rows] == [("m-no-wait", "dead-lettered")]
    ((_, _, body),) = get_all(topology, "q:tasks:dlq")
    assert b"retry copy of message_id=m-no-wait" in body and b"returned unroutable" in body


@pytest.mark.timeout(60)
def test_retries_that_cannot_be_checked_are_refused(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """No management API at the given URL: a backoff worker will not confirm retries into wait
    queues it could not check, and says how to run without the check."""
    blind = BrokerSettings(topology.amqp_url, "http://127.0.0.1:9")
    result = run_script(
        blind, "worker.py", "--retry", "backoff", "--dedup-path", str(tmp_path / "d.sqlite3")
    )
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert "cannot check the retry topology" in line and "--no-verify-topology" in line


@pytest.mark.timeout(60)
def test_sigterm_while_waiting_for_the_queue_is_a_clean_stop(
    vhost: BrokerSettings, tmp_path: Path
) -> None:
    proc = worker(vhost, tmp_path, "--wait-for-queue", "30")
    with pytest.raises(Exception, match="timed out"):
        proc.wait(3)  # waiting for q:tasks, which nobody declares
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, 10)
    assert code == 0, err
    assert out.splitlines()[-1] == "worker stopped (SIGTERM received): 0 deliveries handled"


# --- found in review: each a class of its own ---------------------------------------------------
def _redeliver(settings: BrokerSettings, queue: str = "q:tasks") -> None:
    """Take every message of ``queue`` without acking it and drop the connection: the broker
    requeues them with redelivered=true."""
    with open_channel(settings) as channel:
        while channel.basic_get(queue, auto_ack=False)[0] is not None:
            pass


@pytest.mark.timeout(60)
def test_an_already_committed_redelivery_is_a_duplicate_not_poison(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """A claim committed whose ack was lost, redelivered after more than max_redeliveries
    counted crashes of other deliveries: acked as a duplicate, never dead-lettered as poison."""
    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    store.process_once("m-done", lambda db: None)  # committed; its ack never arrived
    for _ in range(5):
        store.note_redelivery("m-done", time.time())
    publish(topology, ("ok", "m-done"), ("ok", "m-new"))
    _redeliver(topology)
    reports: list[DeliveryReport] = []
    config = consumer_config(idle_exit=1.0, ack_batch=2, prefetch=4, max_redeliveries=1)
    Consumer(topology, lab_handler, store, config, on_report=reports.append).run()
    assert sorted((r.message_id, r.outcome) for r in reports) == [
        ("m-done", "duplicate"),
        ("m-new", "processed"),
    ]
    assert ready_count(topology, "q:tasks:dlq") == 0


@pytest.mark.timeout(60)
def test_a_handler_calling_sys_exit_fails_its_message_not_the_worker(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    """SystemExit is not an Exception: it used to travel up and end the worker with exit 0."""

    def exits(task: Any, db: Any) -> None:
        if task.message_id == "m-exit":
            raise SystemExit(0)
        lab_handler(task, db)

    publish(topology, ("ok", "m-exit"), ("ok", "m-after"))
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    Consumer(topology, exits, store, consumer_config(idle_exit=1.0), on_report=reports.append).run()
    # with handlers at once (CI's concurrency 4), m-after may settle before m-exit's requeue
    assert settled_order([(r.message_id, r.outcome) for r in reports]) == settled_order(
        [("m-exit", "requeued"), ("m-after", "processed"), ("m-exit", "dead-lettered")]
    )
    ((_, _, body),) = get_all(topology, "q:tasks:dlq")
    assert b'"type":"SystemExit"' in body and b'"classification":"unknown"' in body


@pytest.mark.timeout(60)
def test_an_error_message_with_a_lone_surrogate_still_reaches_the_dlq(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    def undecodable_error(task: Any, db: Any) -> None:
        raise ValueError(b"bad \xff name".decode("utf-8", "surrogateescape"))

    publish(topology, ("ok", "m-surrogate"))
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    config = consumer_config(idle_exit=1.0)
    Consumer(topology, undecodable_error, store, config, on_report=reports.append).run()
    assert [r.outcome for r in reports] == ["requeued", "dead-lettered"]
    ((_, _, body),) = get_all(topology, "q:tasks:dlq")
    assert b"bad \\udcff name" in body  # kept, JSON-escaped
