"""The settings of the outbox's own PostgreSQL sessions, given when a connection starts, so
that no other client of the server ever runs with them (pure: no I/O).

A relay's connection runs with ``synchronous_commit = off`` and sequential and bitmap scans off
(:data:`RELAY_SETTINGS`), and a relay's or an operator's with a ``lock_timeout``. Set with
``SET`` once connected, they belong to the server's session - and behind a pooler in
transaction mode (PgBouncer's ``pool_mode = transaction``, the default of many hosted
offers) that session is handed to whichever client comes next. Measured here with PgBouncer
1.18 and a pool of one: after a relay's ``SET synchronous_commit = off``, the application's
own connection read ``off`` too - its commits, business rows and outbox rows alike, no longer
waited for the WAL flush, and a server crash could lose them after the application was told
they had committed; its queries lost sequential scans and failed after 10 s of waiting for a
lock. The same leak is reported with ``search_path`` (pgbouncer/pgbouncer#396), a read-only
default (psycopg/psycopg2#503) and the isolation level (matrix-org/synapse#4473).

So the settings go in libpq's ``options`` startup parameter instead (``-c name=value``,
https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNECT-OPTIONS): the server
applies them to this connection's session from its first statement, and no statement can
carry them to another client. A pooler refuses that parameter (PgBouncer: ``unsupported
startup parameter: options``, :func:`refused`); the connection is then made again without it,
and the settings are given per transaction (``set_config(..., true)``), which ends with the
transaction on any server connection (:class:`~amqp_lab.outbox.db.OutboxDb`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from psycopg.conninfo import conninfo_to_dict

__all__ = ["REFUSED_TEXT", "RELAY_SETTINGS", "lock_timeout_value", "refused", "startup_options"]

RELAY_SETTINGS = (
    ("synchronous_commit", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_seqscan", "off"),
    ("jit", "off"),
)
"""A relay's session: its commits do not wait for the WAL flush (a commit lost in a server
crash only makes rows go again, same message_id - never lost or reordered), and its leases read
the due rows by index (:data:`~amqp_lab.outbox.sql.LEASE_SCANS` says why). Operators' and
writers' connections keep the defaults: their commits are durable.

``jit`` off: with sequential scans off, a plan that has no other way to read a table (the
relays' table has no index on ``seen_at``) still scans it, but its cost counts 10^10, past
``jit_above_cost``, so the server compiled the statement with LLVM first - 17-53 ms for a
one-row ``DELETE`` (measured, PostgreSQL 15), on the relay's loop at every heartbeat. The
relay's statements are short; compiling them never pays."""

REFUSED_TEXT = "unsupported startup parameter"
"""What PgBouncer answers a startup parameter it does not track (``options`` among them,
unless its ``ignore_startup_parameters`` lists it)."""


def lock_timeout_value(seconds: float) -> str:
    """``lock_timeout`` as PostgreSQL takes it: whole milliseconds, at least 1 (``0`` would
    mean no timeout)."""
    return f"{max(1, round(seconds * 1000))}ms"


def startup_options(
    settings: Sequence[tuple[str, str]], conninfo: str, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The ``options`` keyword for ``psycopg.connect(conninfo, **options)`` giving ``settings``
    (name, value) as ``-c name=value``, followed by the options ``conninfo`` gives itself -
    or, when it gives none, libpq's ``PGOPTIONS`` from ``environ``, which libpq reads only when
    no ``options`` is passed (later ones win, so your own ``-c`` settings are kept); empty
    without settings. Names and values must hold no space or backslash (ours never do: else
    ValueError). Raises psycopg.ProgrammingError for a conninfo libpq cannot parse."""
    if not settings:
        return {}
    for name, value in settings:
        if any(c.isspace() or c == "\\" for c in f"{name}{value}"):
            raise ValueError(f"a startup setting holds a space or a backslash: {name}={value}")
    ours = " ".join(f"-c {name}={value}" for name, value in settings)
    given = conninfo_to_dict(conninfo).get("options")
    if given is None:
        given = environ.get("PGOPTIONS")
    given = str(given or "").strip()
    return {"options": f"{ours} {given}" if given else ours}


def refused(error: BaseException) -> bool:
    """Whether a failed connection attempt was a pooler refusing the ``options`` parameter."""
    return REFUSED_TEXT in str(error)
