"""A leased batch, as the relay's store hands it over (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from amqp_lab.outbox.db import number
from amqp_lab.outbox.row import OutboxRow, UndecodableText

__all__ = ["Lease", "leased_row"]


@dataclass
class Lease:
    """One leased batch: ``rows`` by id, ``chains`` (:mod:`amqp_lab.outbox.chains`),
    ``db_now`` (the database's clock at the lease) and ``local_now`` (``time.time()`` then:
    their difference turns a local confirm time into the database's); ``blocked``: the keys
    found holding back due rows - their head refused, parked, not yet due or another relay's
    (:func:`~amqp_lab.outbox.sql.blocked_sql`) - for the relay to skip for a while (a key
    whose head could go but did not fit the batch, or lost it to another relay, is among them
    too: it waits that while); ``more_behind``: the lease stopped after
    :data:`~amqp_lab.outbox.rounds.LEASE_ROUNDS` windows with its window still full of held-back
    rows, so due rows of other keys may lie beyond it - the relay leases again at once,
    skipping ``blocked``."""

    rows: dict[int, OutboxRow] = field(default_factory=dict)
    chains: list[list[int]] = field(default_factory=list)
    db_now: float = 0.0
    local_now: float = 0.0
    blocked: list[str] = field(default_factory=list)
    more_behind: bool = False


def leased_row(values: Sequence[Any]) -> OutboxRow:
    """An OutboxRow from a RETURNING row, whatever a hostile row holds: numbers that are not
    numbers read as 0 (the message itself is checked by row.message_of)."""
    (row_id, message_id, key, exchange, routing_key, properties, headers, body) = values[:8]
    traceparent, tracestate, created_at, due_at, tries = values[8:13]
    return OutboxRow(
        id=int(row_id),
        message_id=message_id,
        ordering_key=key if isinstance(key, str) else None,
        exchange=exchange,
        routing_key=routing_key,
        properties=properties,
        headers=bytes(headers) if isinstance(headers, bytes | memoryview) else headers,
        body=bytes(body) if isinstance(body, memoryview) else body,
        traceparent=_text(traceparent),
        tracestate=_text(tracestate),
        created_at=number(created_at),
        due_at=None if due_at is None else number(due_at),
        tries=int(number(tries, 1)),
    )


def _text(value: Any) -> str | None:
    """A trace context column as text, or None when it is none (not text, not UTF-8)."""
    return value if isinstance(value, str) and not isinstance(value, UndecodableText) else None
