"""State per broker and vhost never collides, on a real broker: vhosts ``X/b`` and ``X_b``
(one default store file before) each process their own copy of one message_id, and a store
shared on purpose - SQLite or PostgreSQL - serves the first vhost and refuses the second in
one line (password masked), while another node list for the same vhost is accepted."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqp_lab.consuming.consumer import Consumer
from amqp_lab.dedup import open_store
from amqp_lab.dedup.identity import bind_vhost, bound_vhost
from amqp_lab.errors import StoreVhostMismatch, VhostAccessDenied
from amqp_lab.ordering import OrderedConfig, OrderedConsumer
from amqp_lab.publishing.blocking import Publisher
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology
from amqp_lab.topology.ordered import with_ordered
from lab.handler import task_message
from tests.brokers import TestBroker
from tests.pgsupport import temp_database
from tests.support import ROOT, consumer_config, parse_lines, ready_count, script_env

pytestmark = [pytest.mark.integration, pytest.mark.failure_model]

WORKER = (
    "import sys; from pathlib import Path; from amqp_lab.cli.common import run; "
    "from amqp_lab.cli.worker import main; "
    "run(lambda: main(sys.argv[2:], default_handler='lab.handler:lab_handler', "
    "state_dir=Path(sys.argv[1])))"
)


@pytest.fixture
def two_vhosts(broker: TestBroker) -> Iterator[tuple[BrokerSettings, BrokerSettings]]:
    """Vhosts ``<base>/b`` and ``<base>_b``, each with the lab topology."""
    base = f"t-state-{uuid.uuid4().hex[:6]}"
    names = (f"{base}/b", f"{base}_b")
    with broker.admin() as api:
        for name in names:
            api.create_vhost(name)
            api.set_permissions(name, broker.username)
    pair = (broker.settings(names[0]), broker.settings(names[1]))
    for settings in pair:
        apply_topology(settings, load_topology())
    yield pair
    with broker.admin() as api:
        for name in names:
            api.delete_vhost(name)


def worker(
    settings: BrokerSettings, state_dir: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """The worker command with its default store in ``state_dir`` until 1 s idle."""
    return subprocess.run(
        [sys.executable, "-c", WORKER, str(state_dir), "--idle-exit", "1", *args],
        env=script_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def publish(settings: BrokerSettings, *message_ids: str) -> None:
    with Publisher(settings) as publisher:
        for seq, message_id in enumerate(message_ids):
            publisher.publish(task_message("ok", seq, message_id))


def outcomes(result: subprocess.CompletedProcess[str]) -> list[tuple[str, str]]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [(row["message_id"], row["outcome"]) for row in parse_lines(result.stdout)]


@pytest.mark.timeout(120)
def test_vhosts_a_lossy_name_merged_process_their_own_copies(
    two_vhosts: tuple[BrokerSettings, BrokerSettings], tmp_path: Path
) -> None:
    for settings in two_vhosts:
        publish(settings, "same-1")
    assert [outcomes(worker(s, tmp_path)) for s in two_vhosts] == [[("same-1", "processed")]] * 2
    files = sorted(p.name for p in tmp_path.glob("dedup-*.sqlite3"))
    assert len(files) == 2 and all("_b-" in name for name in files), files


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL with a password in it for PostgreSQL (trust auth ignores it)."""
    if request.param == "sqlite":
        yield str(tmp_path / "shared.sqlite3")
        return
    with temp_database() as url:
        parts = urlsplit(url)
        netloc = f"{parts.username}:hunter2@{parts.hostname}:{parts.port or 5432}"
        yield urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


@pytest.mark.timeout(180)
def test_a_shared_store_serves_one_vhost_and_refuses_the_next(
    two_vhosts: tuple[BrokerSettings, BrokerSettings], shared_store: str, tmp_path: Path
) -> None:
    first, second = two_vhosts
    with closing(open_store(shared_store)) as store:  # a store from before the check
        assert store.process_once("old-1", lambda db: None)
        assert bound_vhost(store) is None
    publish(first, "old-1", "new-1")
    publish(second, "new-1")
    assert outcomes(worker(first, tmp_path, "--dedup-url", shared_store)) == [
        ("old-1", "duplicate"),  # its claim survived the migration
        ("new-1", "processed"),
    ]
    refused = worker(second, tmp_path, "--dedup-url", shared_store)
    assert refused.returncode == 1
    (line,) = refused.stderr.splitlines()
    assert line.startswith("error: dedup store ") and "hunter2" not in line
    assert f"serves vhost {first.vhost!r}" in line and f"not {second.vhost!r}" in line
    assert ready_count(second, "q:tasks") == 1  # nothing of the refused vhost was touched
    # the same vhost through another list of nodes (a cluster named node by node) is accepted
    host, port = first.host, first.port
    alias = "localhost" if host != "localhost" else "127.0.0.1"
    nodes = first.amqp_url + "," + first.amqp_url.replace(f"@{host}:{port}/", f"@{alias}:{port}/")
    publish(first, "new-2")
    assert outcomes(
        worker(BrokerSettings(nodes, first.management_url), tmp_path, "--dedup-url", shared_store)
    ) == [("new-2", "processed")]
    with closing(open_store(shared_store)) as store:
        assert bound_vhost(store) == (first.vhost, f"{host}:{port}")


def test_both_consumers_bind_once_connected_and_refuse_another_vhost(
    two_vhosts: tuple[BrokerSettings, BrokerSettings], tmp_path: Path
) -> None:
    """A vhost the broker refuses binds nothing (a typo must not take a store over); the
    plain and the ordered consumer refuse a store bound to another vhost before consuming."""
    first, second = two_vhosts
    names = with_ordered(load_topology(), shards=2).names
    with closing(open_store(tmp_path / "d.sqlite3")) as store:
        typo = Consumer(first.with_vhost("no-such-vhost"), noop, store, consumer_config())
        with pytest.raises(VhostAccessDenied):
            typo.run()
        assert bound_vhost(store) is None
        bind_vhost(store, first.vhost)
        consumers: list[Consumer | OrderedConsumer] = [
            Consumer(second, noop, store, consumer_config()),
            OrderedConsumer(second, noop, store, OrderedConfig(names)),
        ]
        for consumer in consumers:
            with pytest.raises(StoreVhostMismatch, match=f"not {second.vhost!r}"):
                consumer.run()
            assert consumer.handled == 0


def noop(task: object, db: object) -> None:
    """A handler that must not run."""
    raise AssertionError("the handler ran")
