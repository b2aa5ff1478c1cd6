"""PostgreSQL for tests: a fresh database per test, dropped afterwards.

The server is the machine's PostgreSQL on 127.0.0.1:5432 (trust auth, user postgres), or the
admin URL in ``AMQP_LAB_TEST_POSTGRES``. Tests skip, saying why, only when nothing answers there.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

ADMIN_URL = os.environ.get(
    "AMQP_LAB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def postgres_answers(url: str) -> bool:
    """Whether something listens where the PostgreSQL ``url`` points."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), 2).close()
    except OSError:
        return False
    return True


@contextmanager
def temp_database() -> Iterator[str]:
    """CREATE DATABASE amqp_lab_t_<uuid>; yield its URL; DROP DATABASE ... WITH (FORCE), which
    also ends sessions that killed workers left behind."""
    if not postgres_answers(ADMIN_URL):
        pytest.skip(
            f"no PostgreSQL answers at {urlsplit(ADMIN_URL).netloc} (AMQP_LAB_TEST_POSTGRES)"
        )
    name = f"amqp_lab_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(ADMIN_URL)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
