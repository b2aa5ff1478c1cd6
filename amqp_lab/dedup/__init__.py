"""message_id de-duplication stores: the claim is committed with the handler's writes before
basic.ack, so a redelivery is acked without running the handler again.

SQLite (:mod:`amqp_lab.dedup.sqlite`) for one host, PostgreSQL (:mod:`amqp_lab.dedup.postgres`)
for many, behind one protocol (:mod:`amqp_lab.dedup.base`); :func:`open_store` picks one from a
path or URL; :mod:`amqp_lab.dedup.retention` says how long claims must live.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from amqp_lab.dedup.base import (
    DedupStore,
    HandlerDb,
    ManagedDedupStore,
    Purged,
    Returned,
    StoreStats,
    run_in_savepoint,
)
from amqp_lab.dedup.postgres import PostgresDedupStore
from amqp_lab.dedup.sqlite import SqliteDedupStore
from amqp_lab.errors import ConfigurationError
from amqp_lab.settings import mask_url

__all__ = [
    "DedupStore",
    "HandlerDb",
    "ManagedDedupStore",
    "PostgresDedupStore",
    "Purged",
    "Returned",
    "SqliteDedupStore",
    "StoreStats",
    "open_store",
    "run_in_savepoint",
    "store_kind",
]


def store_kind(url_or_path: str | Path) -> tuple[Literal["sqlite", "postgresql"], str]:
    """Which store a ``--dedup-url`` names: ``("sqlite", path)`` for a plain path or
    ``sqlite:///PATH`` (``sqlite:////abs/path`` for an absolute one), ``("postgresql", url)`` for
    ``postgresql://`` or ``postgres://``. Raises ConfigurationError for anything else."""
    text = str(url_or_path)
    scheme, sep, rest = text.partition("://")
    if not sep:
        if not text:
            raise ConfigurationError("empty dedup store path")
        return "sqlite", text
    if scheme.lower() in ("postgresql", "postgres"):
        return "postgresql", text
    if scheme.lower() == "sqlite" and rest.startswith("/") and len(rest) > 1:
        return "sqlite", rest[1:]
    raise ConfigurationError(
        f"unsupported dedup store {mask_url(text)!r}: use a file path, sqlite:///PATH or "
        "postgresql://user@host:5432/dbname"
    )


def open_store(
    url_or_path: str | Path, clock: Callable[[], float] = time.time, prepare: bool = True
) -> ManagedDedupStore:
    """Open the store :func:`store_kind` names (PostgreSQL via psycopg 3, else SQLite); ``clock``
    gives claim times (epoch seconds); ``prepare`` (PostgreSQL): whether statements may be
    prepared on the server (False behind a pooler in transaction mode that keeps none per
    client: :class:`PostgresDedupStore`). Raises ConfigurationError for an unknown scheme,
    DedupStoreError when it cannot be opened."""
    kind, target = store_kind(url_or_path)
    if kind == "postgresql":
        return PostgresDedupStore(target, clock, prepare=prepare)
    return SqliteDedupStore(target, clock)
