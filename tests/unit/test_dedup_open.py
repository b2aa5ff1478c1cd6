"""Choosing a dedup store from a path or URL, and the placeholder a handler must use."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from subprocess import PIPE

import pytest

from amqp_lab.dedup import SqliteDedupStore, open_store, store_kind
from amqp_lab.errors import ConfigurationError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("dedup.sqlite3", ("sqlite", "dedup.sqlite3")),
        ("/var/lib/x/dedup.sqlite3", ("sqlite", "/var/lib/x/dedup.sqlite3")),
        ("sqlite:///rel/dedup.db", ("sqlite", "rel/dedup.db")),
        ("sqlite:////abs/dedup.db", ("sqlite", "/abs/dedup.db")),
        (
            "postgresql://postgres@127.0.0.1:5432/db",
            ("postgresql", "postgresql://postgres@127.0.0.1:5432/db"),
        ),
        ("postgres://u:p@h/db", ("postgresql", "postgres://u:p@h/db")),
        ("POSTGRESQL://h/db", ("postgresql", "POSTGRESQL://h/db")),
    ],
)
def test_store_kind(given: str, expected: tuple[str, str]) -> None:
    assert store_kind(given) == expected


def test_a_path_object_is_sqlite(tmp_path: Path) -> None:
    assert store_kind(tmp_path / "d.db") == ("sqlite", str(tmp_path / "d.db"))


@pytest.mark.parametrize(
    "given", ["mysql://root:hunter2@db/x", "sqlite://", "sqlite:///", "redis://h"]
)
def test_other_urls_are_refused_without_the_password(given: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^unsupported dedup store ") as caught:
        store_kind(given)
    assert "hunter2" not in str(caught.value)
    assert str(caught.value).endswith(
        ": use a file path, sqlite:///PATH or postgresql://user@host:5432/dbname"
    )


def test_an_empty_path_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"^empty dedup store path$"):
        store_kind("")


def test_open_store_opens_sqlite_for_a_sqlite_url(tmp_path: Path) -> None:
    with closing(open_store(f"sqlite:///{tmp_path}/d.sqlite3")) as store:
        assert isinstance(store, SqliteDedupStore)
        assert (store.location, store.dialect) == (f"{tmp_path}/d.sqlite3", "sqlite")


OPEN_AT = """
import sys, time
from amqp_lab.dedup import SqliteDedupStore
while time.time() < float(sys.argv[2]):
    pass
SqliteDedupStore(sys.argv[1]).close()
"""


def test_processes_opening_a_new_file_at_the_same_moment_all_succeed(tmp_path: Path) -> None:
    """Switching a new file to WAL answers "database is locked" at once to the loser of the
    race, without the busy timeout: the setup is retried (two workers starting together)."""
    for round_ in range(4):
        path, at = tmp_path / f"race-{round_}.sqlite3", time.time() + 1.0
        procs = [
            subprocess.Popen([sys.executable, "-c", OPEN_AT, str(path), str(at)], stderr=PIPE)
            for _ in range(3)
        ]
        errors = [p.communicate(timeout=30)[1].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], errors
