"""Parked keys, kept in the dedup store: which keys of an ordered topology wait for a replay.

With ``after_dead_letter="park"``, a key whose message was dead-lettered is parked: its later
messages go to the DLQ behind it (KeyParked) until that message - the *blocker* - comes back
by a replay (``replay.py --key KEY``), which releases the key. The table lives in the worker's
own dedup store (SQLite or PostgreSQL), so a worker that dies, or a standby that takes the
shard over (single active consumer), finds the key still parked.

A key and a blocker's message_id are whatever a publisher sent, and AMQP lets them hold a NUL
character, which PostgreSQL text cannot: a lookup of such a key failed on every delivery and
stopped the worker. Each is stored as itself, except text holding a NUL or starting with
:data:`ENCODED`, which is stored as that mark and its JSON string (``\\u0000`` for the NUL):
one stored form per text, readable back, the same on SQLite.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from amqp_lab.errors import ConfigurationError

__all__ = ["ParkedKey", "ParkedKeys"]

TABLE = "amqp_lab_parked_keys"
ENCODED = "\ufffe"
"""The mark of a stored text in its JSON form (U+FFFE, a noncharacter: no real key has it)."""
_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (scope TEXT NOT NULL, key TEXT NOT NULL, "
    "message_id TEXT NOT NULL, parked_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (scope, key))"
)


@dataclass(frozen=True)
class ParkedKey:
    """A parked ``key`` of ``scope`` (the ordered entry exchange), blocked behind
    ``message_id`` since ``parked_at`` (epoch seconds)."""

    scope: str
    key: str
    message_id: str
    parked_at: float


def stored(text: str) -> str:
    """``text`` as the table holds it (module docstring): itself, or :data:`ENCODED` and its
    JSON string when it holds a NUL character or starts with the mark."""
    if "\x00" in text or text.startswith(ENCODED):
        return ENCODED + json.dumps(text)
    return text


def read_back(value: str) -> str:
    """The text :func:`stored` stored as ``value`` (a value that starts with the mark but is
    no JSON string - stored as itself by an earlier version - is that value)."""
    if value.startswith(ENCODED):
        try:
            text = json.loads(value[len(ENCODED) :])
        except ValueError:
            return value
        return text if isinstance(text, str) else value
    return value


class ParkedKeys:
    """Parked keys in ``store`` (a store with ``run_in_transaction``: the SQLite and PostgreSQL
    stores of :func:`amqp_lab.dedup.open_store`). Each call is one transaction; store failures
    raise DedupStoreError (StoreUnavailable for an outage), as the store's own calls do.
    Raises ConfigurationError for a store without transactions of its own."""

    def __init__(self, store: Any, scope: str) -> None:
        if not callable(getattr(store, "run_in_transaction", None)):
            raise ConfigurationError(
                "parking keys needs a store with run_in_transaction (open_store's SQLite or "
                "PostgreSQL store)"
            )
        self.store = store
        self.scope = scope
        self._ready = False

    def _run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        def work(db: Any) -> list[tuple[Any, ...]]:
            if not self._ready:
                db.execute(_SCHEMA)
            cursor = db.execute(sql, params)
            rows = cursor.fetchall() if cursor.description is not None else []
            return [tuple(r) for r in rows]

        rows: list[tuple[Any, ...]] = self.store.run_in_transaction(work)
        self._ready = True
        return rows

    def _forms(self, key: str) -> tuple[str, str]:
        """The forms ``key`` may be stored in: :func:`stored`'s, and the key itself, as a
        version before that form stored it (not one holding a NUL on PostgreSQL: never
        stored, and no statement may send it)."""
        raw_ok = "\x00" not in key or getattr(self.store, "dialect", None) == "sqlite"
        return (stored(key), key if raw_ok else stored(key))

    def blocker(self, key: str) -> str | None:
        """The message_id ``key`` is parked behind, or None when it is not parked."""
        rows = self._run(
            f"SELECT message_id FROM {TABLE} WHERE scope = ? AND key IN (?, ?)",
            (self.scope, *self._forms(key)),
        )
        return read_back(str(rows[0][0])) if rows else None

    def park(self, key: str, message_id: str, now: float) -> None:
        """Park ``key`` behind ``message_id`` (a key parked already keeps its first blocker)."""
        if self.blocker(key) is None:
            self._run(
                f"INSERT INTO {TABLE} (scope, key, message_id, parked_at) VALUES (?, ?, ?, ?)",
                (self.scope, stored(key), stored(message_id), now),
            )

    def release(self, key: str) -> None:
        """The key runs again (its blocker came back)."""
        self._run(
            f"DELETE FROM {TABLE} WHERE scope = ? AND key IN (?, ?)",
            (self.scope, *self._forms(key)),
        )

    def all(self) -> list[ParkedKey]:
        """Every parked key of the scope, oldest first."""
        rows = self._run(
            f"SELECT scope, key, message_id, parked_at FROM {TABLE} WHERE scope = ? "
            "ORDER BY parked_at",
            (self.scope,),
        )
        return [
            ParkedKey(str(s), read_back(str(k)), read_back(str(m)), float(t)) for s, k, m, t in rows
        ]
