"""lab.cluster's addresses and node names, and scripts/cluster.py's env output and argument
errors (no Docker needed: none of these reach the engine)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lab.cluster import PARTITION_TIMERS, Cluster, ClusterError
from tests.support import ROOT

pytestmark = pytest.mark.unit


def cluster_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cluster.py"), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent/docker.sock"},
    )


def test_nodes_get_consecutive_ports_and_rabbit_at_rmqN_names() -> None:
    cluster = Cluster(amqp_port=6001, management_port=16001, name="c")
    assert [(n.nodename, n.container, n.amqp_port, n.management_port) for n in cluster.nodes] == [
        ("rabbit@rmq1", "c-rmq1", 6001, 16001),
        ("rabbit@rmq2", "c-rmq2", 6002, 16002),
        ("rabbit@rmq3", "c-rmq3", 6003, 16003),
    ]


@pytest.mark.parametrize("ref", [2, "2", "rmq2", "rabbit@rmq2", "amqp-lab-cluster-rmq2"])
def test_a_node_is_found_by_index_hostname_nodename_or_container(ref: str | int) -> None:
    cluster = Cluster()
    assert cluster.node(ref) is cluster.nodes[1]
    assert cluster.node_for("rabbit@rmq2") is cluster.nodes[1]


@pytest.mark.parametrize("ref", [0, "4", "rmq4", "rabbit@other", ""])
def test_an_unknown_node_is_a_clear_error(ref: str | int) -> None:
    with pytest.raises(ClusterError, match=r"no cluster node .*: choose one of rmq1, rmq2, rmq3"):
        Cluster().node(ref)


def test_a_cluster_needs_a_node() -> None:
    with pytest.raises(ClusterError, match="at least one node"):
        Cluster(size=0)


def test_settings_list_every_node_with_the_same_vhost() -> None:
    settings = Cluster().settings("orders/eu")
    assert settings.amqp_urls == tuple(
        f"amqp://guest:guest@127.0.0.1:{port}/orders%2Feu" for port in (5701, 5702, 5703)
    )
    assert settings.management_bases == tuple(
        f"http://127.0.0.1:{port}" for port in (15701, 15702, 15703)
    )
    assert [a.port for a in settings.addresses()] == [5701, 5702, 5703]
    assert {a.vhost for a in settings.addresses()} == {"orders/eu"}
    one = Cluster().node_settings("rmq3", "v")
    assert (one.amqp_urls, one.management_bases) == (
        ("amqp://guest:guest@127.0.0.1:5703/v",),
        ("http://127.0.0.1:15703",),
    )


def test_env_prints_the_comma_separated_lists() -> None:
    result = cluster_script("env", "--amqp-port", "5801", "--management-port", "15801")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "export EAI_AMQP_URL='amqp://guest:guest@127.0.0.1:5801/%2F,"
        "amqp://guest:guest@127.0.0.1:5802/%2F,amqp://guest:guest@127.0.0.1:5803/%2F'",
        "export EAI_MGMT_URL='http://127.0.0.1:15801,http://127.0.0.1:15802,http://127.0.0.1:15803'",
    ]


def test_kill_without_a_node_is_a_usage_error() -> None:
    result = cluster_script("kill")
    assert result.returncode == 2
    assert "kill takes a NODE" in result.stderr


def test_an_unknown_node_is_one_error_line() -> None:
    result = cluster_script("restart", "rmq7")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: no cluster node 'rmq7': choose one of rmq1, rmq2, rmq3"


def test_no_docker_engine_is_one_error_line() -> None:
    result = cluster_script("status")
    assert result.returncode == 1
    assert result.stderr.startswith("error: Docker is not reachable: ")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["disconnect", "reconnect", "pause", "unpause"])
def test_the_partition_commands_take_a_node(command: str) -> None:
    result = cluster_script(command)
    assert result.returncode == 2
    assert f"{command} takes a NODE" in result.stderr
    unknown = cluster_script(command, "rmq7")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "error: no cluster node 'rmq7': choose one of rmq1, rmq2, rmq3"


@pytest.mark.parametrize("command", ["heal", "status", "start"])
def test_a_node_is_refused_where_a_command_takes_none(command: str) -> None:
    result = cluster_script(command, "rmq2")
    assert result.returncode == 2
    assert "NODE only for kill, restart, disconnect, reconnect, pause, unpause" in result.stderr


def test_the_partition_timers_shorten_failure_detection() -> None:
    """The fragment each node of a partition run reads after rabbitmq.conf (conf.d)."""
    settings = {
        key.strip(): value.strip()
        for key, value in (
            line.split("=", 1)
            for line in PARTITION_TIMERS.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        )
    }
    assert settings == {"net_ticktime": "10", "consumer_disconnected_timeout": "10000"}
    assert Cluster(extra_config=PARTITION_TIMERS).extra_config == PARTITION_TIMERS
    assert Cluster().extra_config is None


class _Joining:
    """A node whose first ``join_cluster`` is killed (exit 137, as CI saw) and whose next
    one joins; records every step."""

    def __init__(self, failures: int) -> None:
        self.failures, self.joined, self.booting = failures, False, 0
        self.steps: list[str] = []

    def ctl(self, node: object, *args: str) -> str:
        self.steps.append(args[0])
        if args[0] == "join_cluster":
            if self.failures:
                self.failures -= 1
                raise ClusterError("rabbitmqctl join_cluster rabbit@rmq1 on rabbit@rmq2 exited 137")
            self.joined = True
        return ""

    def members_seen(self, node: object, running: bool = True) -> tuple[str, ...]:
        if self.joined and self.booting:  # its API does not answer yet after start_app
            self.booting -= 1
            return ()
        return ("rabbit@rmq1", "rabbit@rmq2") if self.joined else ("rabbit@rmq2",)


def _cluster_with(node: _Joining, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    cluster = Cluster(name="c")
    monkeypatch.setattr(cluster, "ctl", node.ctl)
    monkeypatch.setattr(cluster, "members_seen", node.members_seen)
    monkeypatch.setattr(cluster.containers, "start", lambda n: node.steps.append("docker start"))
    return cluster


def test_a_join_that_fails_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    node = _Joining(failures=1)
    cluster = _cluster_with(node, monkeypatch)
    cluster._join(cluster.nodes[1], cluster.nodes[0], deadline=float("inf"))
    assert node.joined
    assert node.steps == [
        "stop_app", "join_cluster", "docker start", "start_app",
        "stop_app", "join_cluster", "start_app",
    ]  # fmt: skip


def test_a_join_that_went_through_is_not_done_again_while_the_node_boots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = _Joining(failures=0)
    node.booting = 2
    cluster = _cluster_with(node, monkeypatch)
    monkeypatch.setattr("lab.cluster.time.sleep", lambda s: None)
    cluster._join(cluster.nodes[1], cluster.nodes[0], deadline=float("inf"))
    assert node.steps == ["stop_app", "join_cluster", "start_app"] and node.booting == 0


def test_a_join_that_keeps_failing_is_tried_three_times(monkeypatch: pytest.MonkeyPatch) -> None:
    node = _Joining(failures=10)
    cluster = _cluster_with(node, monkeypatch)
    with pytest.raises(ClusterError, match="exited 137"):
        cluster._join(cluster.nodes[1], cluster.nodes[0], deadline=float("inf"))
    assert node.steps.count("join_cluster") == 3


def test_a_join_that_keeps_failing_past_the_deadline_is_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = _Joining(failures=10)
    cluster = _cluster_with(node, monkeypatch)
    with pytest.raises(ClusterError, match="exited 137"):
        cluster._join(cluster.nodes[1], cluster.nodes[0], deadline=0.0)
    assert node.steps == ["stop_app", "join_cluster"]


def test_a_member_already_is_not_joined_again(monkeypatch: pytest.MonkeyPatch) -> None:
    node = _Joining(failures=0)
    node.joined = True
    cluster = _cluster_with(node, monkeypatch)
    cluster._join(cluster.nodes[1], cluster.nodes[0], deadline=0.0)
    assert node.steps == []


class _Container:
    def __init__(self, error: Exception | None) -> None:
        self.error, self.removes = error, 0

    def remove(self, force: bool, v: bool) -> None:
        self.removes += 1
        if self.error is not None:
            raise self.error


def test_a_container_whose_removal_is_under_way_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI: a test cluster stopped and started again met 409 "removal of container ... is
    already in progress"; the removal waits for the container to go instead of failing."""
    import docker.errors

    from lab.cluster_nodes import NodeContainers

    busy = docker.errors.APIError(
        "409 Client Error", explanation="removal of container abc is already in progress"
    )
    busy.response = _Response(409)
    node = Cluster(name="t").nodes[1]
    container = _Container(busy)
    seen = iter([container, container, container, None])
    containers = NodeContainers("t", "image")
    monkeypatch.setattr(containers, "get", lambda n: next(seen))
    monkeypatch.setattr(containers, "client", lambda: type("C", (), {"networks": _Networks()})())
    monkeypatch.setattr("lab.cluster_nodes.time.sleep", lambda s: None)
    containers.remove((node,))
    assert container.removes == 1 and next(seen, "done") == "done"

    other = docker.errors.APIError("500 Server Error", explanation="driver failed")
    other.response = _Response(500)
    monkeypatch.setattr(containers, "get", lambda n: _Container(other))
    with pytest.raises(ClusterError, match="removing t-rmq2: 500"):
        containers.remove((node,))
    stuck = _Container(busy)
    monkeypatch.setattr(containers, "get", lambda n: stuck)
    with pytest.raises(ClusterError, match="still there after 0 s"):
        containers.remove((node,), timeout=0)


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code, self.url, self.reason = status_code, "http+docker://localhost/c", "-"


class _Networks:
    def list(self, names: list[str]) -> list[object]:
        return []
