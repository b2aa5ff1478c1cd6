"""The effects table: one row per time a worker applied a message (SQLite, autocommit), so the
runner can count how often each published id was applied. Also the RabbitMQ stream design's
stored offset (table ``offsets``)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL, at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS offsets (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)


def connect(path: Path) -> sqlite3.Connection:
    """An autocommit connection (every INSERT is its own transaction), WAL journal, 30 s busy
    timeout; creates the tables if missing."""
    db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    for statement in SCHEMA:
        db.execute(statement)
    return db


def apply(db: sqlite3.Connection, message_id: str, now: float) -> None:
    """The effect: one committed row for ``message_id`` (``now``: epoch seconds)."""
    db.execute("INSERT INTO effects (id, at) VALUES (?, ?)", (message_id, now))


def counts(path: Path) -> Counter[str]:
    """message id -> effect rows."""
    with sqlite3.connect(str(path), timeout=30) as db:
        return Counter(str(row[0]) for row in db.execute("SELECT id FROM effects"))


def total(db: sqlite3.Connection) -> int:
    """Effect rows so far (the killer's progress signal)."""
    return int(db.execute("SELECT COUNT(*) FROM effects").fetchone()[0])


def stored_offset(db: sqlite3.Connection, name: str) -> int | None:
    """The stream offset stored under ``name`` (the last one applied), or None."""
    row = db.execute("SELECT value FROM offsets WHERE name = ?", (name,)).fetchone()
    return None if row is None else int(row[0])


def store_offset(db: sqlite3.Connection, name: str, value: int) -> None:
    """Store ``value`` as the last offset applied under ``name`` (autocommit)."""
    db.execute(
        "INSERT INTO offsets (name, value) VALUES (?, ?) "
        "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
        (name, value),
    )
