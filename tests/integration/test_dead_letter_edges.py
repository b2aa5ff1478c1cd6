"""Dead-lettering is checked like retrying, and a message the broker accepted can always be
dead-lettered (docs/failure-model.md, "Where a dead letter lands"):

* at every connection the DLQ's effective policy - operator policies included - is checked,
  and any setting that can drop a confirmed record is refused in one line naming the policy;
* a record too large to be JSON goes in its raw form (the body as it is); the broker's limit
  is learnt from its refusal; a record that cannot fit in any form leaves the message where
  it is (parked), and the worker goes on with the rest.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.connection import open_channel
from amqp_lab.consuming.consumer import Consumer, DeliveryReport
from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.dlq.ops import browse
from amqp_lab.dlq.raw_record import RAW_RECORD_HEADER
from amqp_lab.errors import RetryTopologyError
from amqp_lab.management import ManagementClient
from amqp_lab.message import Task
from amqp_lab.publishing import Publisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology, with_queue_type
from tests.brokers import TestBroker
from tests.support import (
    consumer_config,
    get_all,
    lab_message,
    one_error_line,
    publish,
    ready_count,
    run_script,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.failure_model, pytest.mark.timeout(120)]


def _worker(
    settings: BrokerSettings, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return run_script(
        settings,
        "worker.py",
        "--idle-exit",
        "1",
        "--dedup-path",
        str(tmp_path / "d.sqlite3"),
        *args,
    )


def _policy_applied(settings: BrokerSettings, queue: str, key: str) -> None:
    def applied() -> bool:
        with ManagementClient(settings) as api:
            found = api.queue(settings.vhost, queue) or {}
        return key in (found.get("effective_policy_definition") or {})

    wait_for(applied, what=f"{key} in the effective policy of {queue}")


def test_an_operator_policy_that_drops_dlq_records_is_refused_naming_it(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    publish(topology, ("ok", "m-waits"))
    with broker.admin() as api:
        api.put_operator_policy(
            topology.vhost, "cap-dlq", "^q:tasks:dlq$", {"max-length": 5}, apply_to="queues"
        )
    _policy_applied(topology, "q:tasks:dlq", "max-length")
    refused = _worker(topology, tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    line = one_error_line(refused.stderr)
    assert "DLQ 'q:tasks:dlq' drops its oldest records past max-length 5" in line
    assert "operator policy 'cap-dlq'" in line and "reject-publish" in line
    assert ready_count(topology, "q:tasks") == 1  # nothing consumed
    with broker.admin() as api:  # the same limit that refuses instead of dropping is fine
        api.put_operator_policy(
            topology.vhost,
            "cap-dlq",
            "^q:tasks:dlq$",
            {"max-length": 5, "overflow": "reject-publish"},
            apply_to="queues",
        )
    _policy_applied(topology, "q:tasks:dlq", "overflow")
    accepted = _worker(topology, tmp_path)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "m-waits outcome=processed" in accepted.stdout


@pytest.mark.parametrize(
    ("definition", "says"),
    [
        ({"message-ttl": 60000}, "drops records after message-ttl 60000 ms"),
        ({"expires": 3600000}, "expires after 3600000 ms unused"),
    ],
    ids=["message-ttl", "expires"],
)
def test_a_policy_that_expires_dlq_records_is_refused_at_a_reconnect_too(
    topology: BrokerSettings, tmp_path: Path, definition: dict[str, Any], says: str
) -> None:
    """A consumer checks at every connection: a policy added while it runs stops it at its
    next connection, before it consumes again."""
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(tmp_path / "d.sqlite3")
    consumer = Consumer(
        topology, lambda task, db: None, store, consumer_config(prefetch=1), reports.append
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: consumer.state.value == "consuming", what="consuming")
        with ManagementClient(topology) as api:
            api.put_policy(topology.vhost, "dlq-override", "^q:tasks:dlq$", definition, priority=50)
        _policy_applied(topology, "q:tasks:dlq", next(iter(definition)))
        consumer._connection.add_callback_threadsafe(  # a lost connection: it reconnects
            lambda: consumer._connection.close()
        )
        thread.join(30)
    finally:
        consumer.stop()
        store.close()
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RetryTopologyError), errors
    assert says in str(errors[0]) and "policy 'dlq-override'" in str(errors[0])


@pytest.mark.foundation
def test_a_quorum_dlq_with_a_finite_delivery_limit_is_refused_where_the_version_has_one(
    broker: TestBroker, vhost: BrokerSettings, tmp_path: Path
) -> None:
    """Listing the DLQ (basic.get, basic.nack requeue) counts toward a quorum queue's
    delivery-limit up to 4.2; past it a DLQ without a DLX drops the record. Our quorum
    topology sets delivery-limit -1 on it (4.0+); without that policy the default is 20 from
    4.0, none on 3.10."""
    apply_topology(vhost, with_queue_type(load_topology(), "quorum"))
    assert _worker(vhost, tmp_path).returncode == 0  # our topology passes
    with broker.admin() as api:
        api.delete_policy(vhost.vhost, "q-tasks-dlq")

        def policy_gone() -> bool:
            queue = api.queue(vhost.vhost, "q:tasks:dlq") or {}
            return not queue.get("policy") and queue.get("delivery_limit") != "unlimited"

        wait_for(policy_gone, what="the DLQ without its policy")
    result = _worker(vhost, tmp_path)
    if broker.at_least(4, 0):
        assert result.returncode == 1, result.stdout + result.stderr
        assert "is a quorum queue with delivery-limit 20" in one_error_line(result.stderr)
    else:
        assert result.returncode == 0, result.stdout + result.stderr


# --- size ---------------------------------------------------------------------------------
LIMIT = 64 * 1024


def _consume(settings: BrokerSettings, tmp_path: Path) -> list[DeliveryReport]:
    reports: list[DeliveryReport] = []
    store = SqliteDedupStore(tmp_path / "d.sqlite3")

    def handler(task: Task, db: Any) -> None:
        if task.message_id.startswith("m-fail"):
            raise ValueError("this message always fails")

    try:
        Consumer(
            settings,
            handler,
            store,
            consumer_config(prefetch=4, idle_exit=1.0, max_redeliveries=10),
            reports.append,
        ).run()
    finally:
        store.close()
    return reports


def test_a_body_at_the_brokers_limit_is_dead_lettered_in_the_raw_form_and_replays_exactly(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    """The bug class: a record of a body of zeros was six times the body as JSON, so a
    message the broker had accepted could never be dead-lettered. At the limit the JSON
    record is refused (406), the limit is learnt, and the raw form goes."""
    body = b"\x00" * LIMIT  # exactly max_message_size, and JSON would escape every byte
    headers = {"tenant": "acme", "big": "h" * 100_000}  # a large header frame too
    with broker.max_message_size(LIMIT):
        with Publisher(topology) as publisher:
            publisher.publish(lab_message(body=body, message_id="m-fail-limit", headers=headers))
        reports = _consume(topology, tmp_path)
        # not JSON: a business error, dead-lettered at once
        assert [(r.outcome, r.attempts) for r in reports] == [("dead-lettered", 1)]
        (entry,) = browse(topology, "q:tasks:dlq")
    assert (entry.source, entry.message_id, entry.classification) == (
        "record",
        "m-fail-limit",
        "business",
    )
    assert entry.headers["tenant"] == "acme" and entry.headers["big"] == "h" * 100_000
    with open_channel(topology) as channel:  # a look at the wire form, left in place
        method, properties, raw = channel.basic_get("q:tasks:dlq", auto_ack=False)
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert raw == body and RAW_RECORD_HEADER in properties.headers  # the raw form
    wait_for(lambda: ready_count(topology, "q:tasks:dlq") == 1, what="the record back")
    replay = run_script(topology, "replay.py", "--all")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    ((_, properties, again),) = get_all(topology, "q:tasks")
    assert again == body and properties.headers["big"] == "h" * 100_000


def test_a_record_that_cannot_fit_leaves_the_message_in_the_queue_and_the_worker_goes_on(
    broker: TestBroker, topology: BrokerSettings, tmp_path: Path
) -> None:
    """A body over the broker's limit (lowered after it was published) cannot be published
    again in any form: it is parked - left unacked, back in the queue when the consumer
    stops - and reported; the other messages are processed; nothing is lost. Once the limit
    is back, the same message is dead-lettered."""
    with Publisher(topology) as publisher:
        publisher.publish(lab_message(body=b"\x01" * (2 * LIMIT), message_id="m-fail-over"))
    publish(topology, ("ok", "m-ok-1"), ("ok", "m-ok-2"))
    with broker.max_message_size(LIMIT):
        reports = _consume(topology, tmp_path)
    outcomes = sorted((r.message_id or "", r.outcome) for r in reports)
    assert ("m-ok-1", "processed") in outcomes and ("m-ok-2", "processed") in outcomes
    parked = [r for r in reports if r.outcome == "parked"]
    assert parked and {r.message_id for r in parked} == {"m-fail-over"}
    wait_for(lambda: ready_count(topology, "q:tasks") == 1, what="the parked message back")
    assert ready_count(topology, "q:tasks:dlq") == 0
    again = _consume(topology, tmp_path)  # the limit restored: it reaches the DLQ
    assert [r.outcome for r in again][-1] == "dead-lettered"
    ((_, _, record),) = get_all(topology, "q:tasks:dlq")
    assert json.loads(record)["message_id"] == "m-fail-over"  # a JSON record fits again
