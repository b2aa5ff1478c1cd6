"""The outbox's tables, as SQL for each dialect (pure: strings, no I/O).

``amqp_lab_outbox`` holds one row per message added in an application's transaction
(:func:`amqp_lab.outbox.add`) until a relay has it confirmed by the broker; then the row is
deleted, or kept with ``sent_at`` for a retention period. ``amqp_lab_outbox_relays`` lists
the relays running (a heartbeat each), for the status and the health check.

Columns of ``amqp_lab_outbox``:

* ``id``: the commit order of a key's rows. PostgreSQL: an identity with ``CACHE 1`` (a
  session-cached block would hand a later transaction a smaller number); :func:`add` holds a
  transaction-scoped advisory lock on the key from the insert to the commit, so the rows of
  one key get their ids in commit order (docs/outbox.md#commit-order). SQLite:
  ``AUTOINCREMENT`` (never reused) under SQLite's single writer, whose transactions hold the
  write lock from their first write to their commit.
* ``message_id`` (unique), ``ordering_key`` (NULL: no order), ``exchange``, ``routing_key``,
  ``properties`` (standard JSON of the basic properties), ``headers`` (the AMQP field table,
  encoded: lossless), ``body``, ``traceparent`` / ``tracestate`` (the W3C trace context of the
  writing transaction);
* ``created_at``, ``due_at`` (NULL: at once), ``available_at`` (not before: the due time, or a
  refused row's next try; +infinity for a row parked until an operator retries it), epoch
  seconds on the database's clock (PostgreSQL: the server's; SQLite: the host's);
* ``tries`` (times a relay leased it to publish: a row with tries > 0 may have reached the
  broker), ``last_error`` and ``refused_at`` (the broker's last refusal);
* ``lease_owner`` / ``lease_until`` (the relay publishing it now), ``sent_at`` (confirmed).
"""

from __future__ import annotations

from amqp_lab.dedup.base import Dialect

__all__ = ["NOTIFY_CHANNEL", "OUTBOX_TABLE", "RELAYS_TABLE", "SCHEMA_LOCK", "schema"]

OUTBOX_TABLE = "amqp_lab_outbox"
RELAYS_TABLE = "amqp_lab_outbox_relays"
NOTIFY_CHANNEL = "amqp_lab_outbox"
"""The PostgreSQL LISTEN/NOTIFY channel :func:`add` notifies on (delivered at commit)."""
SCHEMA_LOCK = 0x6F7574626F78  # pg_advisory_xact_lock key: concurrent creators create once

_TABLE = """CREATE TABLE IF NOT EXISTS amqp_lab_outbox (
    id {id},
    message_id TEXT NOT NULL,
    ordering_key TEXT,
    exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    properties TEXT NOT NULL,
    headers {blob} NOT NULL,
    body {blob} NOT NULL,
    traceparent TEXT,
    tracestate TEXT,
    created_at {real} NOT NULL,
    due_at {real},
    available_at {real} NOT NULL,
    tries INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    refused_at {real},
    lease_owner TEXT,
    lease_until {real},
    sent_at {real}
){storage}"""

_INDEXES = (
    "CREATE UNIQUE INDEX IF NOT EXISTS amqp_lab_outbox_message_id ON amqp_lab_outbox (message_id)",
    # the relay's scan: rows whose time has come, oldest first
    "CREATE INDEX IF NOT EXISTS amqp_lab_outbox_pending ON amqp_lab_outbox"
    " (available_at, id) WHERE sent_at IS NULL",
    # a key's head: its pending row with the smallest id
    "CREATE INDEX IF NOT EXISTS amqp_lab_outbox_key ON amqp_lab_outbox"
    " (ordering_key, id) WHERE sent_at IS NULL",
    "CREATE INDEX IF NOT EXISTS amqp_lab_outbox_sent ON amqp_lab_outbox"
    " (sent_at) WHERE sent_at IS NOT NULL",
)

_RELAYS = """CREATE TABLE IF NOT EXISTS amqp_lab_outbox_relays (
    relay_id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at {real} NOT NULL,
    seen_at {real} NOT NULL
)"""


def schema(dialect: Dialect) -> tuple[str, ...]:
    """The statements creating the outbox's tables and indexes in ``dialect`` (idempotent:
    ``IF NOT EXISTS``); run them in one transaction, on PostgreSQL after
    ``pg_advisory_xact_lock(SCHEMA_LOCK)`` (two first creations at once collide in
    ``pg_type``). Raises ValueError for another dialect."""
    if dialect == "postgresql":
        kinds = {
            "id": "BIGINT GENERATED ALWAYS AS IDENTITY (CACHE 1) PRIMARY KEY",
            "blob": "BYTEA",
            "real": "DOUBLE PRECISION",
            # room in each page for a row's next version: a lease, a refusal or a renewal then
            # updates no index (a HOT update), which made a lease about twice as fast
            "storage": " WITH (fillfactor = 70)",
        }
    elif dialect == "sqlite":
        kinds = {
            "id": "INTEGER PRIMARY KEY AUTOINCREMENT",
            "blob": "BLOB",
            "real": "REAL",
            "storage": "",
        }
    else:
        raise ValueError(f"no outbox schema for dialect {dialect!r}")
    return (_TABLE.format(**kinds), *_INDEXES, _RELAYS.format(real=kinds["real"]))
