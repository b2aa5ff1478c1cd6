"""The outbox behind a connection pooler in transaction mode (PgBouncer, one server connection
shared by every client): the relay's settings must stay the relay's. Before, the relay set
``synchronous_commit = off``, its plan settings and ``lock_timeout`` with ``SET`` on its
session, and the pooler handed that session to the application - whose commits then stopped
waiting for the WAL flush (:mod:`amqp_lab.outbox.pg_session`). Now a pooler refuses the
settings at connection start, the store sees it (``pooled``) and gives them per transaction;
a direct connection gets them at its start."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from amqp_lab.dedup import HandlerDb, PostgresDedupStore
from amqp_lab.errors import OutboxUnavailable, StoreUnavailable
from amqp_lab.message import message_for
from amqp_lab.outbox import add
from amqp_lab.outbox.db import OutboxDb
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings
from lab.pg_node import PgNode, PgNodeError, find_bin_dir
from tests.integration.test_outbox_faults import commit_order, drained, first_seen_order, relays
from tests.pgbouncer import PgBouncer, unavailable
from tests.support import NAMES, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.failure_model, pytest.mark.no_plain_consumer]

DEFAULTS = {"synchronous_commit": "on", "enable_seqscan": "on", "lock_timeout": "0", "jit": "on"}


@pytest.fixture
def node() -> Iterator[PgNode]:
    try:
        find_bin_dir()
    except PgNodeError as e:
        pytest.skip(f"a PostgreSQL of the test's own is needed behind the pooler: {e}")
    with PgNode() as started:
        yield started


@pytest.fixture
def bouncer(node: PgNode, request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode, one server connection; parametrized indirectly with
    True, it accepts the ``options`` startup parameter and drops it."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    node.create_database("app")
    with PgBouncer(node, "app", ignore_options=getattr(request, "param", False)) as started:
        yield started


def show(db: Any) -> dict[str, str]:
    """The values of :data:`DEFAULTS`' settings on ``db`` (a connection or a HandlerDb)."""
    return {name: str(db.execute(f"SHOW {name}").fetchall()[0][0]) for name in DEFAULTS}


def settings(url: str) -> dict[str, str]:
    """What a new client of ``url`` runs with (through the pooler: the one shared session)."""
    with psycopg.connect(url, autocommit=True) as db:
        return show(db)


def store_settings(store: OutboxStore) -> dict[str, str]:
    """What ``store``'s own calls run with (in one of its transactions)."""
    result: dict[str, str] = store._run("read the settings of", show)
    return result


@pytest.mark.timeout(60)
def test_a_direct_connection_gets_the_relays_settings_at_its_start(node: PgNode) -> None:
    url = node.create_database("app")
    store = OutboxStore(url, relay_session=True, lock_timeout=2.5)
    operator = OutboxStore(url, lock_timeout=10)
    try:
        assert not store.pooled and store.relay_session
        assert store_settings(store) == {
            "synchronous_commit": "off",
            "enable_seqscan": "off",
            "lock_timeout": "2500ms",
            "jit": "off",
        }
        assert store_settings(operator) == DEFAULTS | {"lock_timeout": "10s"}
        assert settings(url) == DEFAULTS  # nobody else's
    finally:
        store.close()
        operator.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bouncer", [False, True], ids=["refused", "ignored"], indirect=True)
def test_a_relay_behind_a_transaction_pooler_leaks_no_setting_and_relays_every_row(
    bouncer: PgBouncer, topology: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused (PgBouncer's default) or accepted and dropped (``ignore_startup_parameters =
    options``: before, the relay then ran without its lock timeout, in autocommit with
    prepared statements that met each other on the shared server session)."""
    url = bouncer.url
    with caplog.at_level(logging.WARNING, "amqp_lab.outbox"):
        store = OutboxStore(url, relay_session=True, lock_timeout=10)
    try:
        assert store.pooled and not store.relay_session
        how = "ignored" if bouncer.ignore_options else "refused"
        assert f"{how} the startup parameter 'options'" in caplog.text
        # in the store's own transaction only: the next client of the shared session has none
        assert store_settings(store) == DEFAULTS | {"lock_timeout": "10s"}
        assert settings(url) == DEFAULTS
    finally:
        store.close()
    with relays(topology, url, 1, poll=0.1) as (relay,):
        with psycopg.connect(url) as db:
            for i in range(30):
                key = f"k{i % 3}"
                add(db, message_for(NAMES, {"n": i}, message_id=f"{key}/w-{i}"), key=key)
                if i % 10 == 9:
                    db.commit()
                    # the application's session, between the relay's statements: its own
                    assert settings(url) == DEFAULTS
        drained(url)
        assert relay.failure is None
    got, duplicates = first_seen_order(topology)
    assert got == commit_order(url)
    assert sum(len(v) for v in got.values()) == 30 and duplicates == 0
    assert settings(url) == DEFAULTS


@pytest.mark.timeout(60)
def test_a_pooled_stores_lock_timeout_holds_for_each_transaction(
    node: PgNode, bouncer: PgBouncer
) -> None:
    """The lock timeout, given per transaction behind the pooler, still bounds a wait for a
    table an operator locked (on a direct connection to the server)."""
    store = OutboxStore(bouncer.url, lock_timeout=1.0)
    assert store.pooled
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(node.url("app")) as db:
            db.execute("LOCK TABLE amqp_lab_outbox IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        with pytest.raises(OutboxUnavailable, match="lock timeout"):
            store.status()
        assert time.monotonic() - started < 5
    finally:
        release.set()
        holder.join(10)
        store.close()
    assert settings(bouncer.url) == DEFAULTS


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("batch", "prepare"),
    [(False, True), (True, True), (True, False)],
    ids=["once", "batch", "unprepared"],
)
def test_a_dedup_store_behind_a_transaction_pooler_stops_preparing_and_loses_nothing(
    node: PgNode, caplog: pytest.LogCaptureFixture, batch: bool, prepare: bool
) -> None:
    """PgBouncer before 1.21 keeps no prepared statement per client: psycopg's (prepared after
    five runs) met other server sessions and failed every thread's claims with
    DedupStoreError - a worker's stop; in a batch, its ``SAVEPOINT delivery`` did (a
    DedupStoreError the store did not recognise) or a handler's own statement (counted as the
    handler's failure). Now the first such failure is an outage (rolled back, retried) and the
    store prepares nothing on the server from then on; with ``prepare=False``, from the
    start: no outage at all."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    node.create_database("app")
    with PgBouncer(node, "app", pool_size=2) as bouncer:
        store = PostgresDedupStore(bouncer.url, prepare=prepare)
        outages: list[StoreUnavailable] = []
        others: list[BaseException] = []
        ran: Counter[str] = Counter()

        def work(thread: int) -> None:
            ids = [f"{thread}-{i}" for i in range(60)]
            units = [ids[i : i + 6] for i in range(0, 60, 6)] if batch else [[m] for m in ids]
            for unit in units:
                while True:
                    try:
                        if batch:
                            results = store.process_batch(
                                [(m, functools.partial(run, m)) for m in unit]
                            )
                            assert results == [True] * len(unit), results
                        else:
                            store.process_once(unit[0], functools.partial(run, unit[0]))
                        break
                    except StoreUnavailable as e:
                        outages.append(e)
                    except BaseException as e:
                        others.append(e)
                        return

        def run(message_id: str, db: Any) -> None:
            db.execute("SELECT 1").fetchall()  # a handler's own statement, prepared too
            ran[message_id] += 1

        with caplog.at_level(logging.WARNING, "amqp_lab.dedup"):
            threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(90)
        try:
            assert others == []
            if prepare:
                assert outages, "no statement met another server session: the pooler was not met"
                assert all("_pg3_" in str(e) for e in outages), outages[:3]
            else:
                assert outages == []
            assert caplog.text.count("no longer prepared on the server") <= 1
            with psycopg.connect(node.url("app")) as db:
                claimed = {r[0] for r in db.execute("SELECT message_id FROM processed")}
            assert claimed == {f"{t}-{i}" for t in range(4) for i in range(60)}
            assert set(ran) == claimed  # every handler ran (a rolled-back one again)
        finally:
            store.close()


@pytest.mark.timeout(60)
def test_an_error_that_only_names_a_prepared_statement_is_the_handlers_failure(
    node: PgNode,
) -> None:
    """Not every error naming ``"_pg3_`` is a pooler's: a handler's data quoted in a unique
    violation, or a statement on the handler's own connection, fails that handler (retried,
    dead-lettered in the end) - taken for an outage, it was retried for ever and then stopped
    the worker."""
    url = node.create_database("app")
    store = PostgresDedupStore(url)

    def quoted(db: Any) -> None:  # a unique violation whose detail quotes the handler's data
        db.execute("CREATE TEMP TABLE IF NOT EXISTS t (k text PRIMARY KEY)")
        db.execute("INSERT INTO t VALUES (?)", ('"_pg3_x"',))
        db.execute("INSERT INTO t VALUES (?)", ('"_pg3_x"',))

    with psycopg.connect(url, autocommit=True) as own:

        def other(db: Any) -> None:  # the handler's own connection, not the store's
            db.execute("SELECT 1")
            HandlerDb(own, "postgresql").execute("EXECUTE _pg3_7")  # (as outbox.add wraps it)

        try:
            with pytest.raises(psycopg.errors.UniqueViolation, match='"_pg3_x"'):
                store.process_once("m-1", quoted)
            with pytest.raises(psycopg.errors.InvalidSqlStatementName, match='"_pg3_7"'):
                store.process_once("m-2", other)
            results = store.process_batch(
                [("m-3", quoted), ("m-4", other), ("m-5", lambda db: None)]
            )
            assert isinstance(results[0], psycopg.errors.UniqueViolation)
            assert isinstance(results[1], psycopg.errors.InvalidSqlStatementName)
            assert results[2] is True
            assert not store._unprepared
            with psycopg.connect(url) as db:
                claimed = {r[0] for r in db.execute("SELECT message_id FROM processed")}
            assert claimed == {"m-5"}  # the failed handlers' claims released
        finally:
            store.close()


@pytest.mark.timeout(60)
def test_a_pooler_met_on_the_stores_connection_is_an_outage_whatever_the_handler_does(
    node: PgNode,
) -> None:
    """A statement on the store's connection that meets a pooler (here: a prepared statement of
    psycopg's name that this server session lacks, as behind the pooler) loses the
    transaction. Caught by the handler, which returns, or raised again as another error
    without ``from``, it is still an outage - rolled back and retried - never the handler's
    failure (which would end in the DLQ) nor a TransientError."""
    url = node.create_database("app")

    def swallowed(db: Any) -> None:
        with contextlib.suppress(psycopg.Error):
            db.execute("EXECUTE _pg3_7")

    def replaced(db: Any) -> None:
        try:
            db.execute("EXECUTE _pg3_7")
        except psycopg.Error:
            raise ValueError("the handler's own words") from None

    later: list[str] = []  # what a handler after the pooler's error did (nothing)
    for work in (swallowed, replaced):
        store = PostgresDedupStore(url)
        try:
            with pytest.raises(StoreUnavailable, match='prepared statement "_pg3_7"'):
                store.process_once(f"once-{work.__name__}", work)
            assert store._unprepared
            assert store.process_once(f"next-{work.__name__}", lambda db: None)  # no stale note
            later.clear()
            with pytest.raises(StoreUnavailable, match='prepared statement "_pg3_7"'):
                store.process_batch(
                    [
                        ("b-1", lambda db: None),
                        (f"b-{work.__name__}", work),
                        ("b-3", lambda db: later.append("ran")),
                    ]
                )
            assert later == []  # the batch stopped at the pooler's error
            assert store.process_batch([(f"after-{work.__name__}", lambda db: None)]) == [True]
            with psycopg.connect(url) as db:
                claimed = {r[0] for r in db.execute("SELECT message_id FROM processed")}
            assert {m for m in claimed if m.endswith(work.__name__) or m.startswith("b-")} == {
                f"next-{work.__name__}",
                f"after-{work.__name__}",
            }
        finally:
            store.close()


@pytest.mark.timeout(90)
def test_a_pooler_that_restarts_is_an_outage_and_both_stores_go_on_after_it(
    bouncer: PgBouncer,
) -> None:
    """PgBouncer stopped under a pooled outbox store and a dedup store (a deploy, a crash):
    each call meanwhile is an outage (OutboxUnavailable, StoreUnavailable: retried by the
    relay and the worker), never a stop; once it is back, both reconnect by themselves, still
    pooled, with nothing half done."""
    outbox = OutboxStore(bouncer.url, relay_session=True, lock_timeout=10)
    dedup = PostgresDedupStore(bouncer.url, connect_timeout=2)
    try:
        assert outbox.pooled
        assert dedup.process_once("before", lambda db: None)
        bouncer.stop()
        with pytest.raises(OutboxUnavailable):
            outbox.status()
        with pytest.raises(StoreUnavailable):
            dedup.process_once("during", lambda db: None)
        bouncer.start()
        assert outbox.status() is not None and outbox.pooled and not outbox.relay_session
        assert store_settings(outbox) == DEFAULTS | {"lock_timeout": "10s"}
        assert dedup.process_once("during", lambda db: None)  # not claimed by the failed try
        assert not dedup.process_once("before", lambda db: None)
    finally:
        outbox.close()
        dedup.close()
    assert settings(bouncer.url) == DEFAULTS


def backends(node: PgNode, database: str) -> int:
    """How many sessions are connected to ``database`` on ``node`` (the asking one apart)."""
    with psycopg.connect(node.admin_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()
    return int(row[0]) if row else -1


@pytest.mark.timeout(60)
def test_a_startup_check_cut_off_is_an_outage_and_leaves_no_session_behind(
    node: PgNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The network fails while the store checks in ``pg_settings`` that its startup settings
    were applied (the server session still up): the call is an outage - the relay retries it
    - and the store closes its connection, never keeping it half set up (the server session
    would stay until the server noticed); the next store starts as a direct connection, with
    its settings."""
    url = node.create_database("app")

    def cut_off(self: OutboxDb, connection: Any) -> bool:
        connection.execute("SELECT 1")  # the session is up, and stays up unless closed
        raise psycopg.OperationalError("consuming input failed: Connection timed out")

    monkeypatch.setattr(OutboxDb, "_applied", cut_off)
    with pytest.raises(OutboxUnavailable, match="Connection timed out"):
        OutboxStore(url, relay_session=True, lock_timeout=2.5)
    wait_for(lambda: backends(node, "app") == 0, 10, what="no session left behind")
    monkeypatch.undo()
    store = OutboxStore(url, relay_session=True, lock_timeout=2.5)
    try:
        assert not store.pooled and store.relay_session
        assert store_settings(store)["lock_timeout"] == "2500ms"
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_a_role_that_may_not_read_pg_settings_gets_its_settings_per_transaction(
    node: PgNode, topology: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """A hardened server revokes ``pg_settings`` from PUBLIC: the store cannot check that its
    startup settings were applied. Before, the relay's store failed to open (OutboxError,
    "permission denied for view pg_settings", every time); now it takes the way that holds
    whether or not they were - per transaction, as behind a pooler - and says why."""
    url = node.create_database("app")
    with psycopg.connect(node.url("app"), autocommit=True) as admin:
        admin.execute("CREATE ROLE app LOGIN")
        admin.execute("GRANT CREATE ON SCHEMA public TO app")
        admin.execute("REVOKE SELECT ON pg_catalog.pg_settings FROM PUBLIC")
    url = url.replace("postgres@", "app@")
    with caplog.at_level(logging.INFO, "amqp_lab.outbox"):
        store = OutboxStore(url, relay_session=True, lock_timeout=2.5)
    try:
        assert store.pooled and not store.relay_session
        warned = [r for r in caplog.records if "this role may not read pg_settings" in r.message]
        assert [r.levelno for r in warned] == [logging.WARNING]  # once: a relay's store
        assert store_settings(store) == {
            "synchronous_commit": "on",  # a relay's own, per call (see the pooled relay test)
            "enable_seqscan": "on",
            "lock_timeout": "2500ms",
            "jit": "on",
        }
    finally:
        store.close()
    with relays(topology, url, 1, poll=0.1) as (relay,):
        with psycopg.connect(url) as db:
            for i in range(10):
                add(db, message_for(NAMES, {"n": i}, message_id=f"k/r-{i}"), key="k")
        drained(node.url("app"))
        assert relay.failure is None
    got, duplicates = first_seen_order(topology)
    assert got == commit_order(node.url("app")) and sum(map(len, got.values())) == 10
    assert duplicates == 0
    wait_for(lambda: backends(node, "app") == 0, 10, what="the relay's sessions closed")
