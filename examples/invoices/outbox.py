"""Issue invoices through the transactional outbox: the invoice row and its message commit
together in the application's own database, or neither does.

``python -m examples.invoices.outbox --db app.sqlite3 --count N [--fail-last]`` (from the
repository root) writes invoice ``<prefix>-<n>`` to the ``invoices`` table and adds its message
to the outbox, one transaction per invoice; ``--fail-last`` makes the last transaction fail
after both writes (a business rule breaking, say), so that invoice is neither stored nor ever
published. A relay then publishes what committed - ``python scripts/relay.py --outbox-url
app.sqlite3`` (or ``amqp-lab-relay``) - and the worker handles it as any invoice
(docs/outbox.md). No broker is needed to issue: only the relay talks to it.

One line per invoice: ``invoice_id=<id> status=committed|rolled-back``. Exit 0.
``--db`` may also be ``postgresql://user@host/db`` (psycopg 3).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from amqp_lab.cli.common import EXIT_OK, run
from amqp_lab.cli.parser import CommandParser
from amqp_lab.message import message_for
from amqp_lab.outbox import add, create_schema
from amqp_lab.topology import load_topology
from examples.invoices.producer import invoices

__all__ = ["TOPOLOGY", "issue_invoices", "main"]

TOPOLOGY = Path(__file__).resolve().parents[2] / "topology" / "invoices.json"


class InvoiceRejected(Exception):
    """A business rule refused the invoice after it was written: its transaction rolls back."""


def connect(db: str) -> Any:
    """The application's own connection: PostgreSQL for a postgresql:// URL, else SQLite."""
    if db.startswith(("postgresql://", "postgres://")):
        return psycopg.connect(db)
    return sqlite3.connect(db)


def issue_invoices(
    connection: Any, bodies: list[dict[str, Any]], fail_last: bool = False
) -> list[tuple[str, str]]:
    """For each invoice, one transaction: its row in ``invoices`` and its message in the
    outbox (message_id = the invoice id). ``fail_last``: the last one raises after both writes
    and rolls back. Returns (invoice_id, committed | rolled-back) per invoice."""
    names = load_topology(TOPOLOGY).names
    create_schema(connection)
    connection.execute(
        "CREATE TABLE IF NOT EXISTS invoices (invoice_id TEXT PRIMARY KEY, customer TEXT NOT NULL,"
        " amount_cents BIGINT NOT NULL)"
    )
    connection.commit()
    mark = "?" if isinstance(connection, sqlite3.Connection) else "%s"
    results = []
    for i, body in enumerate(bodies):
        try:
            connection.execute(
                f"INSERT INTO invoices VALUES ({mark}, {mark}, {mark})",
                (body["invoice_id"], body["customer"], body["amount_cents"]),
            )
            add(connection, message_for(names, body, message_id=body["invoice_id"]))
            if fail_last and i == len(bodies) - 1:
                raise InvoiceRejected(body["invoice_id"])
            connection.commit()
            results.append((body["invoice_id"], "committed"))
        except InvoiceRejected:
            connection.rollback()
            results.append((body["invoice_id"], "rolled-back"))
    return results


def main(argv: list[str] | None = None) -> int:
    """The command (exit code returned)."""
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the application's database (SQLite path)")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--prefix", default="inv")
    parser.add_argument("--fail-last", action="store_true", help="roll the last one back")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be >= 1")
    connection = connect(args.db)
    try:
        for invoice_id, status in issue_invoices(
            connection, invoices(args.count, prefix=args.prefix), args.fail_last
        ):
            print(f"invoice_id={invoice_id} status={status}", flush=True)
    finally:
        connection.close()
    return EXIT_OK


if __name__ == "__main__":
    run(main)
