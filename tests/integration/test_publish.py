"""publish.py and Publisher: confirmed, unroutable (exit 3), nack retried, lost connection,
missing exchange."""

from __future__ import annotations

import uuid

import pytest

from amqp_lab.connection import open_channel
from amqp_lab.errors import MessageNacked, MessageUnroutable, NotFound
from amqp_lab.management import ManagementClient
from amqp_lab.publishing.blocking import Publisher, PublishRetry
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology
from amqp_lab.topology.ordered import with_ordered
from lab.handler import task_message
from tests.support import get_all, parse_lines, ready_count, run_script, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.foundation]


def test_publish_confirms_persistent_message_with_id(topology: BrokerSettings) -> None:
    result = run_script(topology, "publish.py", "--kind", "ok", "--count", "3")
    assert result.returncode == 0, result.stderr
    rows = parse_lines(result.stdout)
    assert [r["status"] for r in rows] == ["confirmed"] * 3
    messages = get_all(topology, "q:tasks")
    assert [p.message_id for _, p, _ in messages] == [r["message_id"] for r in rows]
    _, props, body = messages[0]
    assert props.delivery_mode == 2
    assert props.content_type == "application/json"
    assert isinstance(props.timestamp, int) and props.timestamp > 0
    assert props.headers == {"attempts": 0}
    assert body == b'{"kind":"ok","seq":1}'
    assert ready_count(topology, "q:tasks:audit") == 3


def test_message_id_option_and_transient(topology: BrokerSettings) -> None:
    result = run_script(topology, "publish.py", "--message-id", "fixed-1", "--transient")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "message_id=fixed-1 status=confirmed"
    ((_, props, _),) = get_all(topology, "q:tasks")
    assert (props.message_id, props.delivery_mode) == ("fixed-1", 1)


def test_publish_a_json_body_of_your_own(topology: BrokerSettings) -> None:
    body = '{"invoice_id": "INV-7", "amount_cents": 1200}'
    result = run_script(topology, "publish.py", "--body", body, "--message-id", "inv-7")
    assert (result.returncode, result.stdout.splitlines()[0]) == (
        0,
        "message_id=inv-7 status=confirmed",
    )
    ((_, props, raw),) = get_all(topology, "q:tasks")
    assert (props.message_id, props.content_type, props.delivery_mode) == (
        "inv-7",
        "application/json",
        2,
    )
    assert (raw, props.headers) == (b'{"amount_cents":1200,"invoice_id":"INV-7"}', {"attempts": 0})


def test_a_body_that_is_not_json_is_refused_before_connecting(vhost: BrokerSettings) -> None:
    result = run_script(vhost, "publish.py", "--body", "{not json")
    assert result.returncode == 2
    assert "--body is not JSON: Expecting property name" in result.stderr


def test_unroutable_exits_3_without_retry(topology: BrokerSettings) -> None:
    """Scenario S2: mandatory + confirms turns a silent drop into an 'unroutable' outcome."""
    result = run_script(topology, "publish.py", "--routing-key", "nowhere")
    assert result.returncode == 3
    (row,) = parse_lines(result.stdout)
    assert row["status"] == "unroutable"
    publisher = Publisher(topology, PublishRetry(max_attempts=5, base=0.01))
    with publisher, pytest.raises(MessageUnroutable):
        publisher.publish(task_message("ok", 1, routing_key="nowhere"))
    assert publisher.attempts_made == 1


def _bounded_queue(settings: BrokerSettings) -> None:
    with open_channel(settings) as channel:
        channel.exchange_declare("bounded", "direct", durable=True)
        channel.queue_declare(
            "q:bounded", durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        channel.queue_bind("q:bounded", "bounded", routing_key="task")


def test_nack_is_retried_and_succeeds_once_there_is_room(vhost: BrokerSettings) -> None:
    _bounded_queue(vhost)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        get_all(vhost, "q:bounded")  # make room: the retry after this nack must be confirmed

    with Publisher(vhost, PublishRetry(max_attempts=4, base=0.05, cap=0.2), sleep) as publisher:
        publisher.publish(task_message("ok", 1, "first", exchange="bounded"))
        publisher.publish(task_message("ok", 2, "second", exchange="bounded"))
        assert publisher.attempts_made == 3  # first, second (nacked), second again (acked)
    assert len(sleeps) == 1 and 0 <= sleeps[0] <= 0.05
    assert [p.message_id for _, p, _ in get_all(vhost, "q:bounded")] == ["second"]


def test_nack_retries_run_out_into_a_clear_failure(vhost: BrokerSettings) -> None:
    _bounded_queue(vhost)
    sleeps: list[float] = []
    with Publisher(
        vhost, PublishRetry(max_attempts=4, base=0.05, cap=0.08), sleeps.append
    ) as publisher:
        publisher.publish(task_message("ok", 1, "first", exchange="bounded"))
        with pytest.raises(MessageNacked) as raised:
            publisher.publish(task_message("ok", 2, "second", exchange="bounded"))
        assert publisher.attempts_made == 1 + 4
    assert raised.value.message_id == "second"
    assert len(sleeps) == 3
    assert all(0 <= s <= 0.08 for s in sleeps)  # full jitter, capped
    assert [p.message_id for _, p, _ in get_all(vhost, "q:bounded")] == ["first"]


def test_lost_connection_is_retried_with_the_same_message_id(topology: BrokerSettings) -> None:
    name = f"publisher-{uuid.uuid4().hex[:8]}"
    settings = BrokerSettings(topology.amqp_url, topology.management_url, connection_name=name)
    with Publisher(settings, PublishRetry(max_attempts=5, base=0.05)) as publisher:
        publisher.publish(task_message("ok", 1, "before"))
        with ManagementClient(topology) as api:
            conn = wait_for(
                lambda: [
                    c
                    for c in api.connections(topology.vhost)
                    if c.get("client_properties", {}).get("connection_name") == name
                ],
                what="publisher connection in the management API",
            )
            api.close_connection(conn[0]["name"], "test: force close")
        publisher.publish(task_message("ok", 2, "after"))
        assert publisher.attempts_made == 3
    assert [p.message_id for _, p, _ in get_all(topology, "q:tasks")] == ["before", "after"]


def test_missing_exchange_fails_at_first_publish_and_replaces_channel(
    topology: BrokerSettings,
) -> None:
    """Scenario S3: the 404 is seen at the first publish, the dead channel is replaced."""
    with Publisher(topology) as publisher:
        with pytest.raises(NotFound) as raised:
            publisher.publish(task_message("ok", 1, "lost", exchange="no-such-exchange"))
        assert "404" in str(raised.value)
        publisher.publish(task_message("ok", 2, "kept"))
    assert [p.message_id for _, p, _ in get_all(topology, "q:tasks")] == ["kept"]
    result = run_script(topology, "publish.py", "--exchange", "no-such-exchange", "--count", "10")
    assert result.returncode == 1
    rows = parse_lines(result.stdout)
    assert [r["status"] for r in rows] == ["failed"]
    assert "stopped: 9 message(s) not sent" in result.stdout


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("NaN", "--body is not JSON: NaN is not a JSON number"),
        ('{"amount": Infinity}', "--body is not JSON: Infinity is not a JSON number"),
        ("[-Infinity]", "--body is not JSON: -Infinity is not a JSON number"),
        ('{"name": "\\ud800"}', "--body cannot be sent as JSON: a string holds '\\ud800'"),
        ('"\udcff"', "--body is not UTF-8: byte 0xff"),  # an argument that is not UTF-8
    ],
    ids=["nan", "infinity", "-infinity", "lone-surrogate", "not-utf8"],
)
def test_a_body_that_is_not_standard_json_is_refused_in_one_line(
    vhost: BrokerSettings, body: str, reason: str
) -> None:
    result = run_script(vhost, "publish.py", "--body", body)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and reason in errors[0], result.stderr
    assert result.stdout == ""  # refused before connecting: nothing published


def test_an_ordered_json_body_goes_by_its_key(vhost: BrokerSettings) -> None:
    """publish.py --ordered N --key K --body JSON was refused with 'give each message a key'."""
    names = with_ordered(load_topology(), shards=2).names
    apply_topology(vhost, with_ordered(load_topology(), shards=2))
    one = run_script(
        vhost,
        "publish.py",
        "--ordered",
        "2",
        "--key",
        "order-7",
        "--body",
        '{"order": 7}',
        "--message-id",
        "o-7",
    )
    assert (one.returncode, one.stdout) == (0, "message_id=o-7 status=confirmed\n"), one.stderr
    spread = run_script(
        vhost, "publish.py", "--ordered", "2", "--keys", "3", "--count", "3", "--body", "[1]"
    )
    assert spread.returncode == 0, spread.stdout + spread.stderr
    by_hand = run_script(
        vhost, "publish.py", "--ordered", "2", "--routing-key", "r-1", "--body", "{}"
    )
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    sent = [(m, p, b) for q in names.shard_queues for m, p, b in get_all(vhost, q)]
    by_key = {m.routing_key: (p.headers, b, p.content_type) for m, p, b in sent}
    assert by_key == {
        "order-7": ({"attempts": 0, "key": "order-7"}, b'{"order":7}', "application/json"),
        "key-1": ({"attempts": 0, "key": "key-1"}, b"[1]", "application/json"),
        "key-2": ({"attempts": 0, "key": "key-2"}, b"[1]", "application/json"),
        "key-3": ({"attempts": 0, "key": "key-3"}, b"[1]", "application/json"),
        "r-1": ({"attempts": 0}, b"{}", "application/json"),
    }
