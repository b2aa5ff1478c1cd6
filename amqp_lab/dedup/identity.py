"""Which vhost a dedup store serves: one store, one vhost.

A claim is keyed by message_id alone. Two vhosts writing one store would ack each other's
messages as duplicates whenever their message_ids meet (a test vhost replaying production's
ids, two tenants numbering orders alike): silent loss. The store therefore records the vhost
it serves, in the one-row table ``amqp_lab_store_vhost``, the first time a consumer opens it
(:func:`bind_vhost`), and refuses every other vhost from then on, in one line naming the
store (password masked) and both vhosts.

**Why a refusal and not a vhost column in the claims.** (1) The handler's own tables live in
the same database and transaction: a key column would separate the claims but not the
application's rows, so two vhosts in one database would still mix their data; refusing makes
the separation explicit for everything (one SQLite file, PostgreSQL database, or schema via
``options=-csearch_path=...`` per vhost). (2) The claim's primary key, its index and every
existing store stay as they are: no migration of claims, nothing added on the hot path (the
check is one transaction per consumer start). (3) Only the vhost is compared, not the broker:
every node of a cluster, a blue/green move to a new cluster, a load balancer's name - all the
same vhost keep their store. The broker that bound the store is recorded for people.

**An existing store** (created before this check) has no row: the first consumer that opens
it binds it to its vhost. Stores that two vhosts already shared cannot be told apart after the
fact; the second vhost is refused from then on and needs a store of its own.

The ordered consumer's parked keys (:mod:`amqp_lab.ordering.parking`) keep the vhost in their
scope as well: rows written before a store had a vhost stay unambiguous, and ``keys.py
parked`` reads a store by scope.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from amqp_lab.errors import DedupStoreError, StoreVhostMismatch
from amqp_lab.settings import mask_secrets

__all__ = ["TABLE", "bind_vhost", "bound_vhost", "check_vhost"]

TABLE = "amqp_lab_store_vhost"
_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (one INTEGER PRIMARY KEY CHECK (one = 1), "
    "vhost TEXT NOT NULL, broker TEXT NOT NULL, bound_at DOUBLE PRECISION NOT NULL)"
)
_LOCK = 0x616D71706C6162 + 1  # pg_advisory_xact_lock key: concurrent first binds create once


def _transaction(store: Any, what: str, work: Callable[[Any], Any]) -> Any:
    try:
        return store.run_in_transaction(work)
    except DedupStoreError:
        raise
    except Exception as e:  # the driver's error (sqlite3.Error, psycopg.Error)
        detail = mask_secrets(" ".join(str(e).split()))
        raise DedupStoreError(f"{what} dedup store {store.location}: {detail}") from e


def bound_vhost(store: Any) -> tuple[str, str] | None:
    """(vhost, broker) the store serves, or None when it is not bound yet (or ``store`` has no
    transactions of its own). Raises DedupStoreError when the store fails."""
    if not callable(getattr(store, "run_in_transaction", None)):
        return None

    def work(db: Any) -> tuple[str, str] | None:
        _create(db)
        row = db.execute(f"SELECT vhost, broker FROM {TABLE} WHERE one = 1").fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    result: tuple[str, str] | None = _transaction(store, "cannot read the vhost of", work)
    return result


def bind_vhost(
    store: Any, vhost: str, broker: str = "", clock: Callable[[], float] = time.time
) -> None:
    """Bind ``store`` to ``vhost`` if it serves none yet, in one transaction; do nothing if it
    serves ``vhost``. ``broker``: who binds it, for people (:func:`amqp_lab.state_key.
    broker_identity`); ``clock``: epoch seconds. A store without ``run_in_transaction`` (one
    of your own implementing only :class:`~amqp_lab.dedup.base.DedupStore`) is not checked.

    Raises StoreVhostMismatch when the store serves another vhost; DedupStoreError
    (StoreUnavailable for an outage) when the store fails."""
    if not callable(getattr(store, "run_in_transaction", None)):
        return

    def work(db: Any) -> tuple[str, str]:
        _create(db)
        db.execute(
            f"INSERT INTO {TABLE} (one, vhost, broker, bound_at) VALUES (1, ?, ?, ?) "
            "ON CONFLICT (one) DO NOTHING",
            (vhost, broker, clock()),
        )
        row = db.execute(f"SELECT vhost, broker FROM {TABLE} WHERE one = 1").fetchone()
        return str(row[0]), str(row[1])

    bound, by = _transaction(store, "cannot record the vhost in", work)
    if bound != vhost:
        raise _mismatch(store, bound, by, vhost)


def check_vhost(store: Any, vhost: str) -> None:
    """Raise StoreVhostMismatch when ``store`` serves a vhost other than ``vhost``; bind
    nothing (for tools that read or edit a store a worker owns: ``keys.py parked``).
    Raises DedupStoreError when the store fails."""
    bound = bound_vhost(store)
    if bound is not None and bound[0] != vhost:
        raise _mismatch(store, bound[0], bound[1], vhost)


def _mismatch(store: Any, bound: str, by: str, vhost: str) -> StoreVhostMismatch:
    return StoreVhostMismatch(
        f"dedup store {store.location} serves vhost {bound!r} (bound from {by or '?'}), "
        f"not {vhost!r}: one store serves one vhost - give this vhost its own "
        "(--dedup-path / --dedup-url: another file, database or schema; docs/dedup.md)"
    )


def _create(db: Any) -> None:
    if db.dialect == "postgresql":
        db.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK,))
    db.execute(_SCHEMA)
