"""examples/invoices: what its handler refuses as a business error, what it retries, and the
row it writes in the dedup transaction (a real SQLite store, no broker)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.dedup import SqliteDedupStore
from amqp_lab.errors import BusinessError, TransientError
from amqp_lab.message import JSON, Task, decode_body, message_for
from amqp_lab.topology import load_topology
from examples.invoices.handler import Invoice, handle, parse_invoice
from examples.invoices.producer import TOPOLOGY, invoices

pytestmark = [pytest.mark.unit]
GOOD = {"invoice_id": "inv-1", "customer": "acme", "amount_cents": 1250}


def _task(body: Any, attempt: int = 1, message_id: str = "inv-1") -> Task:
    return Task(message_id, body, {}, "invoices", "invoice", False, attempt, JSON)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x00pdf", "an invoice must be a JSON object, got bytes (not a JSON content type)"),
        ([GOOD], "an invoice must be a JSON object, got list"),
        (None, "an invoice must be a JSON object, got NoneType"),
        ({}, "invoice field 'invoice_id' is missing"),
        ({**GOOD, "note": "x"}, "unknown invoice field(s): note"),
        ({k: v for k, v in GOOD.items() if k != "customer"}, "invoice field 'customer' is missing"),
        ({**GOOD, "invoice_id": 7}, "invoice field 'invoice_id' must be str, got int"),
        ({**GOOD, "customer": None}, "invoice field 'customer' must be str, got NoneType"),
        ({**GOOD, "amount_cents": 12.5}, "invoice field 'amount_cents' must be int, got float"),
        ({**GOOD, "amount_cents": "1250"}, "invoice field 'amount_cents' must be int, got str"),
        ({**GOOD, "amount_cents": True}, "invoice field 'amount_cents' must be int, got bool"),
        ({**GOOD, "flaky": 1}, "invoice field 'flaky' must be bool, got int"),
        (
            {**GOOD, "customer": " "},
            "invoice fields 'invoice_id' and 'customer' must not be empty",
        ),
        (
            {**GOOD, "invoice_id": ""},
            "invoice fields 'invoice_id' and 'customer' must not be empty",
        ),
        ({**GOOD, "amount_cents": 0}, "invoice amount_cents must be > 0, got 0"),
        ({**GOOD, "amount_cents": -5}, "invoice amount_cents must be > 0, got -5"),
    ],
)
def test_parse_invoice_rejects_with_reason(body: Any, reason: str) -> None:
    with pytest.raises(BusinessError, match=f"^{re.escape(reason)}$"):
        parse_invoice(body)


def test_parse_invoice_accepts_an_invoice() -> None:
    assert parse_invoice(GOOD) == Invoice("inv-1", "acme", 1250)
    assert parse_invoice({**GOOD, "flaky": True}) == Invoice("inv-1", "acme", 1250, True)


def _rows(store: SqliteDedupStore) -> list[tuple[Any, ...]]:
    return store.run_in_transaction(
        lambda db: db.execute("SELECT * FROM invoices_sent ORDER BY invoice_id").fetchall()
    )


def test_handle_writes_one_row_with_the_claim(tmp_path: Path) -> None:
    store = SqliteDedupStore(tmp_path / "dedup.sqlite3")
    try:
        assert store.process_once("m-1", lambda db: handle(_task(GOOD, message_id="m-1"), db))
        assert not store.process_once("m-1", lambda db: handle(_task(GOOD, message_id="m-1"), db))
        assert _rows(store) == [("inv-1", "acme", 1250, "m-1")]
    finally:
        store.close()


def test_a_flaky_invoice_fails_once_then_is_sent(tmp_path: Path) -> None:
    store = SqliteDedupStore(tmp_path / "dedup.sqlite3")
    flaky = {**GOOD, "flaky": True}
    try:
        with pytest.raises(TransientError, match="timed out"):
            store.process_once("inv-1", lambda db: handle(_task(flaky, attempt=1), db))
        assert not store.is_processed("inv-1")
        assert store.process_once("inv-1", lambda db: handle(_task(flaky, attempt=2), db))
        assert _rows(store) == [("inv-1", "acme", 1250, "inv-1")]
    finally:
        store.close()


def test_a_business_error_writes_nothing(tmp_path: Path) -> None:
    store = SqliteDedupStore(tmp_path / "dedup.sqlite3")
    try:
        with pytest.raises(BusinessError):
            store.process_once("inv-1", lambda db: handle(_task({**GOOD, "amount_cents": 0}), db))
        assert not store.is_processed("inv-1")
    finally:
        store.close()


def test_the_producer_publishes_what_the_handler_takes() -> None:
    names = load_topology(TOPOLOGY).names
    bodies = invoices(2, bad=True, flaky=True)
    ids = [body["invoice_id"] for body in bodies]
    assert ids == ["inv-1", "inv-2", "inv-bad", "inv-flaky"]
    parsed: list[bool | None] = []
    for body in bodies:
        message = message_for(names, body, message_id=body["invoice_id"])
        assert (message.exchange, message.routing_key) == ("invoices", "invoice")
        assert message.message_id == body["invoice_id"]
        decoded = decode_body(message.body, message.content_type)
        try:
            parsed.append(parse_invoice(decoded).flaky)
        except BusinessError:
            parsed.append(None)
    assert parsed == [False, False, None, True]


def test_the_example_topology_has_its_own_names() -> None:
    topology = load_topology(TOPOLOGY)
    names = topology.names
    assert (names.exchange, names.routing_key, names.queue) == ("invoices", "invoice", "q:invoices")
    assert (names.dead_letter_exchange, names.dlq) == ("invoices.dlx", "q:invoices:dlq")
    assert names.retry_exchange == "invoices.retry"
    assert [names.wait_queue(n) for n in (1, 2, 3)] == [f"q:invoices:wait:{n}" for n in (1, 2, 3)]
    assert (names.max_attempts, names.audit_queue, topology.longest_wait()) == (4, None, 300.0)
    dlx = topology.policy_for("q:invoices")
    assert dlx is not None and dlx.definition_dict["dead-letter-exchange"] == "invoices.dlx"
    for n in (1, 2, 3):
        wait = topology.policy_for(f"q:invoices:wait:{n}")
        assert wait is not None
        assert wait.definition_dict == {
            "dead-letter-exchange": "invoices.retry",
            "message-ttl": 300000,
        }


def test_invoices_issued_through_the_outbox_commit_with_their_message_or_not_at_all(
    tmp_path: Path,
) -> None:
    import sqlite3

    from examples.invoices.outbox import issue_invoices

    db = sqlite3.connect(tmp_path / "billing.sqlite3")
    results = issue_invoices(db, invoices(3), fail_last=True)
    assert results == [("inv-1", "committed"), ("inv-2", "committed"), ("inv-3", "rolled-back")]
    assert [r[0] for r in db.execute("SELECT invoice_id FROM invoices ORDER BY 1")] == [
        "inv-1",
        "inv-2",
    ]
    rows = db.execute("SELECT message_id, exchange, routing_key FROM amqp_lab_outbox ORDER BY id")
    assert rows.fetchall() == [("inv-1", "invoices", "invoice"), ("inv-2", "invoices", "invoice")]
