"""The invoices worker's handler: validate an invoice, send it, record it.

Run it with the worker (``scripts/worker.py --topology topology/invoices.json
--handler examples.invoices.handler:handle``). An invoice is the JSON object
``{"invoice_id": str, "customer": str, "amount_cents": int > 0}``, optionally with
``"flaky": true`` (the simulated sender times out on the first delivery). Anything else is a
:class:`~amqp_lab.errors.BusinessError`: dead-lettered at once, never retried. A
:class:`~amqp_lab.errors.TransientError` from the sender is retried by the worker.

The row in ``invoices_sent`` is written on the worker's ``db``, in the transaction that claims
the message_id: it commits together with the claim, before the ack, so a redelivered invoice
is acked as a duplicate and never written twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amqp_lab.dedup import HandlerDb
from amqp_lab.errors import BusinessError, TransientError
from amqp_lab.message import Task

__all__ = ["Invoice", "handle", "parse_invoice", "send_invoice"]

FIELDS: dict[str, type] = {"invoice_id": str, "customer": str, "amount_cents": int}
OPTIONAL_FIELDS: dict[str, type] = {"flaky": bool}


@dataclass(frozen=True)
class Invoice:
    """A valid invoice. ``flaky``: the simulated sender fails on the first delivery."""

    invoice_id: str
    customer: str
    amount_cents: int
    flaky: bool = False


def _is(value: Any, kind: type) -> bool:
    """``isinstance`` without ``bool`` passing for ``int`` (JSON ``true`` is not an amount)."""
    if kind is int and isinstance(value, bool):
        return False
    return isinstance(value, kind)


def parse_invoice(body: Any) -> Invoice:
    """The invoice in a task's body. Raises BusinessError naming what is wrong: not a JSON
    object, a missing, extra or mistyped field, an empty id or customer, an amount <= 0."""
    if not isinstance(body, dict):
        got = "bytes (not a JSON content type)" if isinstance(body, bytes) else type(body).__name__
        raise BusinessError(f"an invoice must be a JSON object, got {got}")
    extra = sorted(str(key) for key in body if key not in FIELDS and key not in OPTIONAL_FIELDS)
    if extra:
        raise BusinessError(f"unknown invoice field(s): {', '.join(extra)}")
    for name, kind in (FIELDS | OPTIONAL_FIELDS).items():
        if name not in body:
            if name in FIELDS:
                raise BusinessError(f"invoice field {name!r} is missing")
        elif not _is(body[name], kind):
            raise BusinessError(
                f"invoice field {name!r} must be {kind.__name__}, got {type(body[name]).__name__}"
            )
    invoice = Invoice(
        body["invoice_id"], body["customer"], body["amount_cents"], body.get("flaky", False)
    )
    if not invoice.invoice_id.strip() or not invoice.customer.strip():
        raise BusinessError("invoice fields 'invoice_id' and 'customer' must not be empty")
    if invoice.amount_cents <= 0:
        raise BusinessError(f"invoice amount_cents must be > 0, got {invoice.amount_cents}")
    return invoice


def send_invoice(invoice: Invoice, attempt: int) -> None:
    """The flaky dependency, simulated (an e-mail or e-invoicing gateway): a flaky invoice
    times out on its first delivery (TransientError, so the worker retries it)."""
    if invoice.flaky and attempt == 1:
        raise TransientError(f"invoice gateway timed out (503) sending {invoice.invoice_id!r}")


def handle(task: Task, db: HandlerDb) -> None:
    """The worker's handler: validate the invoice (BusinessError), send it (TransientError
    when the gateway fails), then record it in ``invoices_sent`` in the dedup transaction."""
    invoice = parse_invoice(task.body)
    send_invoice(invoice, task.attempt)
    _ensure_table(db)
    db.execute(
        "INSERT INTO invoices_sent(invoice_id, customer, amount_cents, message_id) "
        "VALUES (?, ?, ?, ?)",
        (invoice.invoice_id, invoice.customer, invoice.amount_cents, task.message_id),
    )


def _ensure_table(db: HandlerDb) -> None:
    """CREATE TABLE IF NOT EXISTS invoices_sent. On PostgreSQL two first transactions creating
    it at once collide (a unique violation in pg_type), so the first creation is serialized by
    a transaction-scoped advisory lock; once the table exists no lock is taken."""
    if db.dialect == "postgresql":
        if db.execute("SELECT to_regclass('invoices_sent')").fetchone()[0] is not None:
            return
        db.execute("SELECT pg_advisory_xact_lock(hashtext('amqp-lab examples.invoices'))")
    db.execute(
        "CREATE TABLE IF NOT EXISTS invoices_sent (invoice_id TEXT NOT NULL, "
        "customer TEXT NOT NULL, amount_cents BIGINT NOT NULL, message_id TEXT NOT NULL)"
    )
