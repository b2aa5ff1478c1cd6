"""scripts/chaos.py --cluster at test size (200 messages, 2 leader kills, 3 workers) on its own
three-node RabbitMQ 4.3 cluster: each kill SIGKILLs the node hosting the quorum queue q:tasks'
leader while publishing and consuming; every confirmed message_id is applied exactly once, the
consumers resume after each kill, and each outstanding confirm has an outcome. The ledger and
the queue's Raft term are read directly, not only through the summary."""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.dedup import open_store
from amqp_lab.settings import BrokerSettings
from lab.cluster import DEFAULT_IMAGE, Cluster
from tests.brokers import require_image
from tests.support import run_script, strict_json

pytestmark = pytest.mark.integration

NAME, AMQP_PORT, MANAGEMENT_PORT = "amqp-lab-chaos-test-cluster", 5721, 15721
CLUSTER_ARGS = (
    "--cluster",
    "--cluster-name",
    NAME,
    "--cluster-amqp-port",
    str(AMQP_PORT),
    "--cluster-management-port",
    str(MANAGEMENT_PORT),
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A three-node cluster for this module (its own name and ports, clear of the cluster
    tests' and of scripts/cluster.py start's), removed at the end."""
    require_image(DEFAULT_IMAGE, "sid", "the cluster chaos needs three containers")
    c = Cluster(name=NAME, amqp_port=AMQP_PORT, management_port=MANAGEMENT_PORT)
    c.stop()  # leftovers of an interrupted run
    c.start()
    yield c
    c.stop()


@pytest.fixture
def cluster_vhost(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[BrokerSettings]:
    """A fresh vhost on the cluster; settings naming all three nodes."""
    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40]
    name += "-" + uuid.uuid4().hex[:6]
    cluster.management(lambda api: api.create_vhost(name))
    cluster.management(lambda api: api.set_permissions(name, cluster.username))
    yield cluster.settings(name)
    for node in cluster.nodes:
        if cluster.state(node) != "running":
            cluster.restart(node)
    cluster.management(lambda api: api.delete_vhost(name))


def raft_term(cluster: Cluster, vhost: str) -> int:
    """The quorum queue q:tasks' current Raft term, as its members report it."""
    return max(int(m["Term"]) for m in cluster.quorum_status(vhost, "q:tasks"))


@pytest.mark.cluster
@pytest.mark.timeout(480)
def test_leader_kills_lose_nothing_and_apply_nothing_twice(
    cluster: Cluster, cluster_vhost: BrokerSettings, tmp_path: Path
) -> None:
    url = str(tmp_path / "dedup.sqlite3")
    started = time.monotonic()
    result = run_script(
        cluster_vhost,
        "chaos.py",
        *CLUSTER_ARGS,
        *("--messages", "200", "--kills", "2", "--workers", "3", "--dedup-url", url, "--json"),
        timeout=420,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary: dict[str, Any] = strict_json(result.stdout.splitlines()[-1])
    print(f"cluster chaos took {time.monotonic() - started:.0f}s: {summary['failovers']}")
    assert {k: summary[k] for k in ("published_confirmed", "distinct_ledger_ids", "in_dlq")} == {
        "published_confirmed": 200,
        "distinct_ledger_ids": 200,
        "in_dlq": 0,
    }
    assert (summary["lost"], summary["applied_twice"]) == (0, 0)
    assert (summary["mode"], summary["kills"], summary["publisher_error"]) == ("cluster", 2, None)
    assert summary["duplicates_skipped"] >= 20  # at least the 20 deliberate duplicates
    assert (summary["left_in_queue"], summary["invariant_holds"]) == (0, True)
    nodes = {n.nodename for n in cluster.nodes}
    for kill in summary["failovers"]:
        assert kill["node"] in nodes
        assert kill["hit_leader"] is True and kill["leader_before"] == kill["node"]
        assert (kill["publishing"], kill["consuming"]) == (True, True)  # messages in flight
        assert kill["leader_after"] in nodes - {kill["node"]}
        assert kill["resume_s"] is not None and 0 < kill["resume_s"] < 60
        fates = kill["confirmed_later"] + kill["retried"] + kill["failed"]
        assert (fates, kill["unresolved"]) == (kill["outstanding"], 0)
    assert result.stdout.count("SIGKILL rabbit@") == 2
    # two elections at least beyond the first leader's term 1: the kills really moved it
    assert raft_term(cluster, cluster_vhost.vhost) >= 3
    with closing(open_store(url)) as store:
        rows = store.run_in_transaction(
            lambda db: db.execute("SELECT message_id FROM ledger").fetchall()
        )
    counts = Counter(str(m) for (m,) in rows)
    assert (len(counts), set(counts.values())) == (200, {1})


def test_cluster_chaos_refuses_an_address_list_without_the_cluster_nodes() -> None:
    """Checked before anything touches a broker or Docker: one clear line, exit 1."""
    settings = BrokerSettings("amqp://guest:guest@127.0.0.1:5999/x")
    result = run_script(settings, "chaos.py", *CLUSTER_ARGS, "--messages", "60", timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == (
        "error: --cluster: EAI_AMQP_URL names 127.0.0.1:5999 but not the cluster's "
        "127.0.0.1:5721, 127.0.0.1:5722, 127.0.0.1:5723; list every node: "
        'eval "$(python scripts/cluster.py env --vhost VHOST)"'
    )


def test_cluster_chaos_refuses_options_it_cannot_honour() -> None:
    settings = BrokerSettings("amqp://guest:guest@127.0.0.1:5999/x")
    for args, error in [
        (("--messages", "59"), "--cluster needs --messages >= 10 * (--kills + 1)"),
        (("--unsafe-auto-ack",), "--cluster kills leaders only"),
        (("--kills", "0"), "--cluster needs --kills >= 1"),
    ]:
        result = run_script(settings, "chaos.py", *CLUSTER_ARGS, *args, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.count("\n") == 1, (args, result.stderr)  # one line, no usage
        assert result.stderr.startswith(f"error: {error}"), args
