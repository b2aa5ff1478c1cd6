"""The DLQ console (Flask test client) against a real broker: groups, record pages that escape
hostile input, the token, CSRF, replay and delete with a dry run and exact selection, the
audit log, a least-privilege user, and error pages for a broker that is down or refuses."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask

from amqp_lab.connection import open_channel
from amqp_lab.console import create_app
from amqp_lab.dlq.fingerprint import fingerprint_of, group, selects
from amqp_lab.dlq.ops import browse, delete
from amqp_lab.errors import BusinessError
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from tests.brokers import TestBroker
from tests.console_support import (
    CUSTOMERS,
    DIVISION,
    HOSTILE,
    THREE_GROUPS,
    TIMEOUTS,
    Failure,
    fill_dlq,
    free_port,
)
from tests.support import NAMES, get_all, lab_message, ready_count, wait_ready_count

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def filled(topology: BrokerSettings) -> BrokerSettings:
    """The topology's vhost with six DLQ records in three groups (3 + 2 + 1)."""
    fill_dlq(topology, THREE_GROUPS)
    wait_ready_count(topology, NAMES.dlq, len(THREE_GROUPS))
    return topology


def console(settings: BrokerSettings, tmp_path: Path, **options: Any) -> Flask:
    options.setdefault("token", None)
    app = create_app(settings, NAMES, audit_log=tmp_path / "audit.jsonl", **options)
    app.testing = True
    return app


def fingerprint(settings: BrokerSettings, failures: list[Failure]) -> str:
    """The fingerprint id of the group holding ``failures`` (from the DLQ as it is)."""
    ids = {f.message_id for f in failures}
    for g in group(browse(settings, NAMES.dlq)):
        if {e.message_id for e in g.entries} == ids:
            return g.id
    raise AssertionError(f"no group of exactly {sorted(ids)}")


def dlq_ids(settings: BrokerSettings) -> list[str]:
    return sorted(e.message_id or "" for e in browse(settings, NAMES.dlq))


def csrf_of(app: Flask) -> str:
    return str(app.config["AMQP_LAB_CSRF"])


def audit_lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def text(response: Any) -> str:
    return str(response.get_data(as_text=True))


def test_the_index_groups_the_dlq_and_pages_escape_hostile_input(
    filled: BrokerSettings, tmp_path: Path
) -> None:
    app = console(filled, tmp_path)
    client = app.test_client()
    index = client.get("/")
    assert index.status_code == 200
    page = text(index)
    assert [int(n) for n in re.findall(r'<span class="count">(\d+)</span>', page)] == [3, 2, 1]
    assert "order &lt;n&gt; has no customer &lt;str&gt;" in page
    assert "inventory did not answer within &lt;n&gt; s (request &lt;hex&gt;)" in page
    assert "price_per_unit" in page  # the raising frame of the ZeroDivisionError group
    assert '<code class="queue">q:tasks</code>' in page
    assert "<strong>6</strong> records in <strong>3</strong> groups" in " ".join(page.split())
    assert index.headers["Content-Security-Policy"].startswith("default-src 'none'")

    fp = fingerprint(filled, CUSTOMERS)
    group_page = text(client.get(f"/group/{fp}"))
    assert all(f.message_id in group_page for f in CUSTOMERS)
    assert "order 1002 has no customer &#39;c-23&#39;" in group_page

    record = client.get(f"/group/{fp}/record?message_id=order-1002")
    assert record.status_code == 200
    page = text(record)
    assert HOSTILE not in page and "<script>" not in page
    assert "&lt;script&gt;alert(&#39;dlq&#39;)&lt;/script&gt;" in page  # header and payload
    assert re.search(r'<code class="tag">D</code> decimal</td><td class="value">12.50</td>', page)
    assert re.search(r'<code class="tag">I</code> signed 32-bit</td><td class="value">3', page)
    assert "Original exchange</dt><dd><code>tasks</code>" in page
    assert "Routing key</dt><dd><code>task</code>" in page
    assert "x-death" not in page  # a record that never waited in a wait queue

    division = fingerprint(filled, DIVISION)
    detail = text(client.get(f"/group/{division}/record?message_id=price-3001"))
    assert "Traceback (most recent call last)" in detail and "ZeroDivisionError" in detail
    assert client.get("/group/0123456789ab").status_code == 404
    assert client.get(f"/group/{fp}/record?message_id=nope").status_code == 404
    wait_ready_count(filled, NAMES.dlq, 6)  # browsing consumed nothing


def test_a_large_dlq_is_capped_and_says_so(filled: BrokerSettings, tmp_path: Path) -> None:
    page = " ".join(text(console(filled, tmp_path, max_records=4).test_client().get("/")).split())
    assert "Showing the first 4 of 6 records" in page
    assert "<strong>6</strong> records" in page
    assert [int(n) for n in re.findall(r'<span class="count">(\d+)</span>', page)] == [3, 1]
    app = console(filled, tmp_path, max_records=2)
    fp = fingerprint(filled, CUSTOMERS)
    dry = text(app.test_client().get(f"/group/{fp}/delete"))
    assert re.findall(r'name="message_id" value="([^"]+)"', dry) == ["order-1001", "order-1002"]
    assert 'id="capped"' in dry
    wait_ready_count(filled, NAMES.dlq, 6)


def test_a_message_the_broker_dead_lettered_shows_its_x_death(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    with Publisher(topology) as publisher:
        publisher.publish(lab_message(body=b'{"n":1}', message_id="raw-1"))
    with open_channel(topology) as channel:
        method, _, _ = channel.basic_get(NAMES.queue, auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=False)  # the DLX moves it, raw
    wait_ready_count(topology, NAMES.dlq, 1)
    client = console(topology, tmp_path).test_client()
    page = text(client.get("/"))
    assert "dead-lettered:rejected" in page
    (g,) = group(browse(topology, NAMES.dlq))
    detail = text(client.get(f"/group/{g.id}/record?message_id=raw-1"))
    assert "x-death" in detail and "rejected" in detail and "q:tasks" in detail


def test_a_token_is_required_on_every_request(filled: BrokerSettings, tmp_path: Path) -> None:
    app = console(filled, tmp_path, token="tok-123")
    client = app.test_client()
    assert client.get("/").status_code == 401
    assert client.get("/static/console.css").status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    signed_in = client.get("/group/0123456789ab?token=tok-123&x=1")
    assert signed_in.status_code == 302
    assert signed_in.headers["Location"] == "/group/0123456789ab?x=1"  # no token in the URL
    cookie = signed_in.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "tok-123" not in cookie
    assert client.get("/").status_code == 200  # the cookie carries it now
    other = app.test_client()
    assert other.get("/", headers={"Authorization": "Bearer tok-123"}).status_code == 200
    assert other.get("/", headers={"Authorization": "Bearer tok-124"}).status_code == 401
    # without a token, only a loopback Host is served (no DNS rebinding)
    open_app = console(filled, tmp_path).test_client()
    assert open_app.get("/", headers={"Host": "evil.example:8085"}).status_code == 400
    assert open_app.get("/", headers={"Host": "127.0.0.1:8085"}).status_code == 200


def test_a_post_without_the_csrf_token_is_refused(filled: BrokerSettings, tmp_path: Path) -> None:
    app = console(filled, tmp_path)
    client = app.test_client()
    fp = fingerprint(filled, CUSTOMERS)
    for form in ({"message_id": "order-1001"}, {"message_id": "order-1001", "csrf": "forged"}):
        refused = client.post(f"/group/{fp}/delete", data=form)
        assert refused.status_code == 403
        assert "CSRF" in text(refused)
    wait_ready_count(filled, NAMES.dlq, 6)
    assert audit_lines(tmp_path) == []


def test_delete_removes_exactly_the_selected_records(
    filled: BrokerSettings, tmp_path: Path
) -> None:
    app = console(filled, tmp_path)
    client = app.test_client()
    customers = fingerprint(filled, CUSTOMERS)
    dry = client.get(f"/group/{customers}/delete?message_id=order-1002")
    assert dry.status_code == 200
    assert re.findall(r'name="message_id" value="([^"]+)"', text(dry)) == ["order-1002"]
    wait_ready_count(filled, NAMES.dlq, 6)  # a dry run deletes nothing
    done = client.post(
        f"/group/{customers}/delete", data={"csrf": csrf_of(app), "message_id": "order-1002"}
    )
    assert done.status_code == 200 and "1 record deleted" in text(done)
    timeouts = fingerprint(filled, TIMEOUTS)
    dry_group = text(client.get(f"/group/{timeouts}/delete"))
    ids = re.findall(r'name="message_id" value="([^"]+)"', dry_group)
    assert ids == ["stock-2001", "stock-2002"]
    done = client.post(f"/group/{timeouts}/delete", data={"csrf": csrf_of(app), "message_id": ids})
    assert "2 records deleted" in text(done)
    wait_ready_count(filled, NAMES.dlq, 3)
    assert dlq_ids(filled) == ["order-1001", "order-1003", "price-3001"]
    assert ready_count(filled, NAMES.queue) == 0  # deleted, not replayed
    lines = audit_lines(tmp_path)
    assert [(line["message_id"], line["status"]) for line in lines] == [
        ("order-1002", "deleted"),
        ("stock-2001", "deleted"),
        ("stock-2002", "deleted"),
    ]
    assert {(line["vhost"], line["queue"]) for line in lines} == {(filled.vhost, NAMES.dlq)}
    assert lines[1]["error_type"] == "TimeoutError" and lines[1]["record_attempts"] == 3
    assert client.get(f"/group/{timeouts}").status_code == 404  # the group is gone


def test_replay_a_group_after_a_dry_run(filled: BrokerSettings, tmp_path: Path) -> None:
    app = console(filled, tmp_path)
    client = app.test_client()
    fp = fingerprint(filled, CUSTOMERS)
    dry = client.get(f"/group/{fp}/replay")
    assert dry.status_code == 200
    ids = re.findall(r'name="message_id" value="([^"]+)"', text(dry))
    assert ids == ["order-1001", "order-1002", "order-1003"]
    assert 'name="rate" type="number" min="0.001" step="any" value="20"' in text(dry)
    assert ready_count(filled, NAMES.queue) == 0  # a dry run sends nothing
    bad_rate = client.post(
        f"/group/{fp}/replay", data={"csrf": csrf_of(app), "message_id": ids, "rate": "-1"}
    )
    assert bad_rate.status_code == 400
    done = client.post(
        f"/group/{fp}/replay", data={"csrf": csrf_of(app), "message_id": ids, "rate": "50"}
    )
    assert done.status_code == 200 and "3 records replayed" in text(done)
    replayed = get_all(filled, NAMES.queue)
    assert sorted(props.message_id for _, props, _ in replayed) == ids
    assert {props.headers["attempts"] for _, props, _ in replayed} == {0}
    wait_ready_count(filled, NAMES.dlq, 3)
    assert dlq_ids(filled) == ["price-3001", "stock-2001", "stock-2002"]
    lines = audit_lines(tmp_path)
    assert [(line["message_id"], line["status"]) for line in lines] == [
        (i, "replayed") for i in ids
    ]
    assert client.get(f"/group/{fp}").status_code == 404


def test_a_record_that_changed_since_its_dry_run_is_not_touched(
    filled: BrokerSettings, tmp_path: Path
) -> None:
    app = console(filled, tmp_path)
    client = app.test_client()
    fp = fingerprint(filled, CUSTOMERS)
    ids = re.findall(r'name="message_id" value="([^"]+)"', text(client.get(f"/group/{fp}/replay")))
    assert "order-1001" in ids
    # meanwhile order-1001 was replayed elsewhere and failed again, differently
    (gone,) = delete(filled, selects(fp, ["order-1001"]), queue=NAMES.dlq)
    fill_dlq(filled, [Failure("order-1001", BusinessError("customer c-17 is blocked"), "business")])
    wait_ready_count(filled, NAMES.dlq, 6)
    assert fingerprint_of(gone.entry).id == fp
    done = client.post(f"/group/{fp}/replay", data={"csrf": csrf_of(app), "message_id": ids})
    page = text(done)
    assert "2 records replayed" in page
    assert re.search(r'id="missing".*<code>order-1001</code>', page, re.S)
    assert sorted(p.message_id for _, p, _ in get_all(filled, NAMES.queue)) == [
        "order-1002",
        "order-1003",
    ]
    wait_ready_count(filled, NAMES.dlq, 4)
    changed = [e for e in browse(filled, NAMES.dlq) if e.message_id == "order-1001"]
    assert [e.error_message for e in changed] == ["customer c-17 is blocked"]


def test_error_pages_for_a_broker_that_is_down_refuses_or_lacks_the_dlq(
    topology: BrokerSettings, tmp_path: Path
) -> None:
    empty = console(topology, tmp_path).test_client().get("/")
    assert empty.status_code == 200 and "The DLQ is empty." in text(empty)
    down = BrokerSettings(f"amqp://someone:s3cret-pw@127.0.0.1:{free_port()}/{topology.vhost}")
    app = console(down, tmp_path)
    client = app.test_client()
    for response in (
        client.get("/"),
        client.get("/group/0123456789ab"),
        client.post("/group/0123456789ab/delete", data={"csrf": csrf_of(app), "message_id": "m-1"}),
    ):
        page = text(response)
        assert response.status_code == 503, page
        assert "broker unavailable" in page
        assert "s3cret-pw" not in page and "Traceback" not in page
    wrong = BrokerSettings(
        f"amqp://{topology.username}:wrong-s3cret@{topology.host}:{topology.port}/"
        + quote(topology.vhost, safe="")
    )
    refused = console(wrong, tmp_path).test_client().get("/")
    assert refused.status_code == 502 and "wrong-s3cret" not in text(refused)
    missing = console(topology, tmp_path, queue="q:no-such-dlq").test_client().get("/")
    assert missing.status_code == 404
    assert "DLQ not found" in text(missing) and "q:no-such-dlq" in text(missing)


@pytest.fixture
def least_privileged(broker: TestBroker, filled: BrokerSettings) -> Iterator[BrokerSettings]:
    """A user without management tags, allowed only the DLQ (read) and the exchange a replay
    publishes to (write) in the test's vhost."""
    name, password = f"console-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    with broker.admin() as api:
        api.create_user(name, password, tags="")
        api.set_permissions(
            filled.vhost, name, configure="^$", write=f"^{NAMES.exchange}$", read=f"^{NAMES.dlq}$"
        )
    yield BrokerSettings(
        f"amqp://{name}:{password}@{filled.host}:{filled.port}/" + quote(filled.vhost, safe="")
    )
    with broker.admin() as api:
        api.delete_user(name)


def test_a_least_privileged_user_can_browse_replay_and_delete(
    least_privileged: BrokerSettings, filled: BrokerSettings, tmp_path: Path
) -> None:
    app = console(least_privileged, tmp_path)
    client = app.test_client()
    assert re.findall(r'<span class="count">(\d+)</span>', text(client.get("/"))) == [
        "3",
        "2",
        "1",
    ]
    division = fingerprint(filled, DIVISION)
    assert client.get(f"/group/{division}/replay").status_code == 200
    done = client.post(
        f"/group/{division}/replay", data={"csrf": csrf_of(app), "message_id": "price-3001"}
    )
    assert "1 record replayed" in text(done)
    timeouts = fingerprint(filled, TIMEOUTS)
    done = client.post(
        f"/group/{timeouts}/delete",
        data={"csrf": csrf_of(app), "message_id": ["stock-2001", "stock-2002"]},
    )
    assert "2 records deleted" in text(done)
    wait_ready_count(filled, NAMES.dlq, 3)
    assert [p.message_id for _, p, _ in get_all(filled, NAMES.queue)] == ["price-3001"]
