"""The transactional outbox: a message is published if and only if the transaction that
wrote it committed; and scheduled messages that survive every restart (docs/outbox.md).

Write with :func:`add` (and :func:`cancel`) on your own connection - psycopg 3, sqlite3, or a
handler's ``db`` - in your own transaction. A relay (:class:`OutboxRelay`: ``amqp-lab-relay``,
or ``amqp-lab-worker --outbox``) publishes committed rows with publisher confirms and
``mandatory``, each key's rows in commit order, and deletes them (or keeps them for a while)
once confirmed.
"""

from amqp_lab.outbox.status import FailedRow, OutboxStatus, outbox_problems
from amqp_lab.outbox.store import OutboxStore, open_outbox
from amqp_lab.outbox.write import CancelResult, add, cancel, create_schema

__all__ = [
    "CancelResult",
    "FailedRow",
    "OutboxStatus",
    "OutboxStore",
    "add",
    "cancel",
    "create_schema",
    "open_outbox",
    "outbox_problems",
]
