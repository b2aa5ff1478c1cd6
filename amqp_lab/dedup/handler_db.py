"""The handler's ``db``: the store's connection as a handler sees it, the same in every store
and mode (:class:`HandlerDb`), the placeholder translation for PostgreSQL, and one handler of a
batch in a savepoint (:func:`run_in_savepoint`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

from psycopg.rows import tuple_row

from amqp_lab.errors import DedupStoreError

__all__ = ["Dialect", "HandlerDb", "qmark_to_format", "run_in_savepoint"]

Dialect = Literal["sqlite", "postgresql"]
OnError = Callable[[BaseException], None]


@functools.lru_cache(maxsize=1024)
def qmark_to_format(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (and a literal ``%`` as ``%%``), leaving quoted
    strings and identifiers alone but for their ``%``."""
    out: list[str] = []
    quote: str | None = None
    for char in sql:
        if char == "%":
            out.append("%%")
        elif quote is not None:
            out.append(char)
            if char == quote:
                quote = None
        elif char in ("'", '"'):
            quote = char
            out.append(char)
        elif char == "?":
            out.append("%s")
        else:
            out.append(char)
    return "".join(out)


class HandlerDb:
    """The store's connection as a handler sees it, the same in every store and mode.

    ``execute(sql, params)`` and ``executemany(sql, rows)`` take ``?`` placeholders;
    ``dialect`` is ``sqlite`` or ``postgresql``. The first use calls ``on_first_use`` (the
    SQLite store begins its transaction only then, so a handler's work outside the database
    does not hold the write lock; in a batch, a SAVEPOINT, so a failing handler's writes roll
    back alone). What would end the store's transaction - ``commit``, ``rollback``, ``close``,
    ``executescript``, ``with db:`` - raises TypeError.

    ``used`` turns true only once ``on_first_use`` succeeded: a handler that catches a failed
    BEGIN (the write lock not granted in time) and tries again begins again. With
    ``guard_transaction`` (SQLite), a statement after the transaction ended underneath the
    handler (SQLite rolls back by itself on a full disk or an I/O error) raises DedupStoreError
    instead of running in autocommit mode - it would commit without the claim, and the
    redelivery would apply it a second time. ``on_error`` is told of the error of each
    statement it runs before it is raised (not of a statement on a cursor it returned), so
    the store sees what failed on its connection even when the handler catches it (a
    connection pooler's error: PostgresDedupStore)."""

    __slots__ = (
        "_connection",
        "_format",
        "_guard",
        "_on_error",
        "_on_first_use",
        "_savepoint",
        "dialect",
        "used",
    )

    def __init__(
        self,
        connection: Any,
        dialect: Dialect,
        on_first_use: Callable[[], None] | None = None,
        guard_transaction: bool = False,
        savepoint: bool = False,
        on_error: OnError | None = None,
    ) -> None:
        self._connection = connection
        self._on_error = on_error  # told of each statement's error before it is raised
        self.dialect = dialect
        self._format = dialect == "postgresql"
        self._on_first_use = on_first_use
        self._guard = guard_transaction
        self._savepoint = savepoint  # the first use opens SAVEPOINT delivery (after on_first_use)
        self.used = False

    @property
    def connection(self) -> Any:
        """The driver's connection underneath (psycopg 3 or sqlite3)."""
        return self._connection

    def _use(self) -> Any:
        if not self.used:
            if self._on_first_use is not None:
                self._on_first_use()
            if self._savepoint:
                _statement(self._connection, self.dialect, "SAVEPOINT delivery", self._on_error)
            self.used = True
        if self._guard and not self._connection.in_transaction:
            raise DedupStoreError(
                "the store's transaction ended under the handler (the database rolled it back): "
                "nothing of this delivery is committed; it will be redelivered"
            )
        return self._connection

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """Run one statement; ``?`` placeholders, ``params`` a sequence. Returns a cursor whose
        rows are tuples, whatever row factory the connection has (an application's connection
        given to :func:`amqp_lab.outbox.add` or ``cancel`` may make dicts or objects: ``cancel``
        read ``row[0]`` and raised KeyError after its DELETE had run)."""
        connection = self._use()
        if self._format and params is not None:
            sql = qmark_to_format(sql)
        try:
            connection = _tuple_rows(connection)
            return connection.execute(sql) if params is None else connection.execute(sql, params)
        except Exception as e:
            if self._on_error is not None:
                self._on_error(e)
            raise

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        """Run one statement for every row of ``rows`` (``?`` placeholders)."""
        connection = self._use()
        try:
            if self._format:
                with connection.cursor() as cursor:
                    cursor.executemany(qmark_to_format(sql), rows)
                    return cursor
            return connection.executemany(sql, rows)
        except Exception as e:
            if self._on_error is not None:
                self._on_error(e)
            raise

    def __getattr__(self, name: str) -> Any:
        if name in _ENDS_THE_TRANSACTION:
            raise TypeError(
                f"db.{name} would end the store's transaction; the store commits after the "
                "handler (a batch after its last handler)"
            )
        raise AttributeError(f"HandlerDb has no {name!r}: use execute() or executemany()")

    def __enter__(self) -> HandlerDb:
        raise TypeError("with db: would commit the store's transaction")

    def __exit__(self, *exc: object) -> None:
        raise TypeError("with db: would commit the store's transaction")


def _tuple_rows(connection: Any) -> Any:
    """``connection`` when its rows are tuples (psycopg's ``tuple_row``, sqlite3's None), else
    a cursor of it whose rows are."""
    factory = getattr(connection, "row_factory", None)
    if factory is None or factory is tuple_row:
        return connection
    if hasattr(connection, "pgconn"):  # psycopg
        return connection.cursor(row_factory=tuple_row)
    cursor = connection.cursor()
    cursor.row_factory = None
    return cursor


_ENDS_THE_TRANSACTION = frozenset({"commit", "rollback", "close", "executescript", "autocommit"})


def run_in_savepoint(
    connection: Any,
    dialect: Dialect,
    work: Callable[[Any], None],
    check: Callable[[], None],
    on_error: OnError | None = None,
) -> BaseException | None:
    """Run one handler of a batch on a :class:`HandlerDb` whose first use opens ``SAVEPOINT
    delivery``; then ``check()`` (the store's test that its transaction is still usable).
    Returns None after RELEASE, or the exception ``work`` or ``check`` raised after ROLLBACK
    TO. A DedupStoreError (the store failed or was misused) is raised, not returned. One
    object per handler (the HandlerDb): a batch of 500 fast handlers allocates little for the
    garbage collector to trace. ``on_error`` is told of the error of every statement on
    ``connection``, the handler's and the savepoints' (the store's own connection)."""
    guard = dialect == "sqlite"
    db = HandlerDb(connection, dialect, guard_transaction=guard, savepoint=True, on_error=on_error)
    try:
        work(db)
        check()
    except DedupStoreError:
        raise
    except BaseException as e:  # the handler's error (sys.exit() too): roll back this one only
        if db.used:
            _statement(connection, dialect, "ROLLBACK TO delivery", on_error)
            _statement(connection, dialect, "RELEASE delivery", on_error)
        return e
    if db.used:
        _statement(connection, dialect, "RELEASE delivery", on_error)
    return None


def _statement(
    connection: Any, dialect: Dialect, statement: str, on_error: OnError | None = None
) -> None:
    """Run a savepoint statement, never prepared on the server (a batch runs each many times:
    psycopg would prepare it, and behind a pooler in transaction mode meet another server
    session); DedupStoreError when it fails."""
    try:
        if dialect == "postgresql":
            connection.execute(statement, prepare=False)
        else:
            connection.execute(statement)
    except Exception as e:  # sqlite3.Error or psycopg.Error
        if on_error is not None:
            on_error(e)
        raise DedupStoreError(f"{statement} failed: {e}") from e
