"""Parked keys, kept in the dedup store: which keys of an ordered topology wait for a replay.

With ``after_dead_letter="park"``, a key whose message was dead-lettered is parked: its later
messages go to the DLQ behind it (KeyParked) until that message - the *blocker* - comes back
by a replay (``replay.py --key KEY``), which releases the key. The table lives in the worker's
own dedup store (SQLite or PostgreSQL), so a worker that dies, or a standby that takes the
shard over (single active consumer), finds the key still parked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amqp_lab.errors import ConfigurationError

__all__ = ["ParkedKey", "ParkedKeys"]

TABLE = "amqp_lab_parked_keys"
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

    def blocker(self, key: str) -> str | None:
        """The message_id ``key`` is parked behind, or None when it is not parked."""
        rows = self._run(
            f"SELECT message_id FROM {TABLE} WHERE scope = ? AND key = ?",
            (
                self.scope,
                key,
            ),
        )
        return str(rows[0][0]) if rows else None

    def park(self, key: str, message_id: str, now: float) -> None:
        """Park ``key`` behind ``message_id`` (a key parked already keeps its first blocker)."""
        if self.blocker(key) is None:
            self._run(
                f"INSERT INTO {TABLE} (scope, key, message_id, parked_at) VALUES (?, ?, ?, ?)",
                (self.scope, key, message_id, now),
            )

    def release(self, key: str) -> None:
        """The key runs again (its blocker came back)."""
        self._run(f"DELETE FROM {TABLE} WHERE scope = ? AND key = ?", (self.scope, key))

    def all(self) -> list[ParkedKey]:
        """Every parked key of the scope, oldest first."""
        rows = self._run(
            f"SELECT scope, key, message_id, parked_at FROM {TABLE} WHERE scope = ? "
            "ORDER BY parked_at",
            (self.scope,),
        )
        return [ParkedKey(str(s), str(k), str(m), float(t)) for s, k, m, t in rows]
