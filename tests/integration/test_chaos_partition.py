"""scripts/chaos.py --cluster --partition at test size (300 messages, 3 workers, 2 partitions
and 2 pauses) on a three-node RabbitMQ 4.3 cluster of its own, started with the partition
timers (net_ticktime 10 s, consumer_disconnected_timeout 10 s; clients' heartbeat 5 s,
confirm timeout 15 s), so that each fault takes seconds, not minutes (docs/cluster.md#partitions).

Every confirmed message_id is applied exactly once (read from the ledger itself too), the
faults hit the nodes they aim at, the nodes declared the long ones down and not the stall,
confirms and deliveries resumed after each, and the cluster is whole at the end."""

from __future__ import annotations

import json
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
from lab.cluster import DEFAULT_IMAGE, PARTITION_TIMERS, Cluster
from tests.brokers import require_image
from tests.support import run_script

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

NAME, AMQP_PORT, MANAGEMENT_PORT = "amqp-lab-partition-test-cluster", 5731, 15731
CLUSTER_ARGS = (
    "--cluster",
    "--partition",
    "--cluster-name",
    NAME,
    "--cluster-amqp-port",
    str(AMQP_PORT),
    "--cluster-management-port",
    str(MANAGEMENT_PORT),
)
MESSAGES = 300


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A three-node cluster with the partition timers, for this module (its own name and
    ports), removed at the end: paused and cut-off nodes too."""
    require_image(DEFAULT_IMAGE, "sid", "the partition chaos needs three containers")
    c = Cluster(
        name=NAME,
        amqp_port=AMQP_PORT,
        management_port=MANAGEMENT_PORT,
        extra_config=PARTITION_TIMERS,
    )
    c.stop()  # leftovers of an interrupted run
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def cluster_vhost(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[BrokerSettings]:
    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40]
    name += "-" + uuid.uuid4().hex[:6]
    cluster.management(lambda api: api.create_vhost(name))
    cluster.management(lambda api: api.set_permissions(name, cluster.username))
    yield cluster.settings(name)
    cluster.heal()
    cluster.management(lambda api: api.delete_vhost(name))


@pytest.mark.timeout(600)  # the cluster's start (~30 s) and the run (~2 min) with room
def test_partitions_and_pauses_lose_nothing_and_apply_nothing_twice(
    cluster: Cluster, cluster_vhost: BrokerSettings, tmp_path: Path
) -> None:
    url = str(tmp_path / "dedup.sqlite3")
    started = time.monotonic()
    result = run_script(
        cluster_vhost,
        "chaos.py",
        *CLUSTER_ARGS,
        *("--messages", str(MESSAGES), "--workers", "3", "--partitions", "2", "--pauses", "2"),
        *("--heartbeat", "5", "--confirm-timeout", "15", "--dedup-url", url, "--json"),
        timeout=420,
    )
    took = time.monotonic() - started
    print(result.stdout.rsplit("\n", 2)[0], result.stderr, sep="\n")  # shown when it fails
    assert result.returncode == 0
    summary: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    events: list[dict[str, Any]] = summary["events"]
    print(f"partition chaos took {took:.0f}s (run {summary['seconds']}s)")
    assert (summary["lost"], summary["applied_twice"]) == (0, 0)
    assert {k: summary[k] for k in ("published_confirmed", "distinct_ledger_ids", "in_dlq")} == {
        "published_confirmed": MESSAGES,
        "distinct_ledger_ids": MESSAGES,
        "in_dlq": 0,
    }
    assert (summary["mode"], summary["partitions"], summary["pauses"]) == ("partition", 2, 2)
    assert summary["timers"] == {
        "net_ticktime": 10,
        "consumer_disconnected_timeout": 10.0,
        "heartbeat": 5,
        "confirm_timeout": 15.0,
    }
    assert (summary["publisher_error"], summary["left_in_queue"]) == (None, 0)
    assert summary["invariant_holds"] is True
    assert summary["duplicates_skipped"] >= MESSAGES // 10  # at least the deliberate ones

    nodes = {n.nodename for n in cluster.nodes}
    assert [(e["kind"], e["role"], e["long"]) for e in events] == [
        ("partition", "leader", True),
        ("pause", "publisher", True),
        ("partition", "consumer", True),
        ("pause", "leader", False),
    ]
    for e in events:
        assert e["node"] in nodes and (e["publishing"], e["unresolved"]) == (True, 0)
        assert 0 < e["confirms_resumed_s"] < 60 and 0 < e["deliveries_resumed_s"] < 60
        assert e["rejoined_s"] is not None and 0 <= e["rejoined_s"] < 60
        assert e["confirmed_later"] + e["retried"] + e["failed"] == e["outstanding"]
        assert set(e["refused"]) == {"nacked", "timed_out", "lost"}
        assert all(n >= 0 for n in e["refused"].values())
        if e["long"]:  # held past 1.25 x net_ticktime: the others declared the node down
            assert 0.7 * 10 <= e["detected_s"] <= e["hold_s"], e
        else:  # a 3 s stall: below every bound, nobody acted on it
            assert e["detected_s"] is None and e["hold_s"] < 0.75 * 10, e
    cut_leader, frozen_publisher, cut_consumer, _ = events
    assert cut_leader["on_leader"] and cut_leader["leader_after"] in nodes - {cut_leader["node"]}
    assert frozen_publisher["publisher_on_node"] is True
    refused = frozen_publisher["refused"]
    assert refused["timed_out"] + refused["lost"] > 0  # unconfirmed on the frozen node
    assert frozen_publisher["confirms_resumed_s"] < 15 + 15  # the timeout, then a reconnect
    assert cut_consumer["workers_on_node"] >= 1
    totals = {k: sum(e["refused"][k] for e in events) for k in ("nacked", "timed_out", "lost")}
    assert summary["confirms_refused"] == totals

    with closing(open_store(url)) as store:
        rows = store.run_in_transaction(
            lambda db: db.execute("SELECT message_id FROM ledger").fetchall()
        )
    counts = Counter(str(m) for (m,) in rows)
    assert (len(counts), set(counts.values())) == (MESSAGES, {1})
    assert cluster.heal() == [] and cluster.is_clustered()  # nothing left cut off or frozen


def test_partition_refuses_what_it_cannot_honour() -> None:
    """Checked before anything touches a broker or Docker: a usage error, exit 2."""
    settings = BrokerSettings("amqp://guest:guest@127.0.0.1:5999/x")
    for args, error in [
        (("--partition",), "--partition needs --cluster"),
        ((*CLUSTER_ARGS, "--partitions", "0", "--pauses", "0"), "--partition needs a fault"),
        ((*CLUSTER_ARGS, "--confirm-timeout", "0"), "--partition needs a fault"),
        ((*CLUSTER_ARGS, "--messages", "49"), "--partition needs --messages >= 10 * ("),
        (("--heartbeat", "5"), "--heartbeat goes with --cluster"),
    ]:
        result = run_script(settings, "chaos.py", *args, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.count("\n") == 1, (args, result.stderr)  # one line, no usage
        assert result.stderr.startswith(f"error: {error}"), args
