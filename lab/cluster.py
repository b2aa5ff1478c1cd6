"""A three-node RabbitMQ cluster on one machine: Docker containers on one Docker network.

Each node is a container from the locally built image (``scripts/build_test_image.sh sid
amqp-lab/rabbitmq:sid``: RabbitMQ 4.3, management plugin enabled, guest allowed from outside
the container) with ``--hostname rmqN``, ``RABBITMQ_NODENAME=rabbit@rmqN``, one shared
``RABBITMQ_ERLANG_COOKIE`` and our ``rabbitmq.conf`` mounted read-only. AMQP (5672) and the
management API (15672) are published on 127.0.0.1 (defaults 5701.. and 15701..). Nodes 2..N
join node 1 with ``rabbitmqctl stop_app``, ``join_cluster rabbit@rmq1``, ``start_app``
(https://www.rabbitmq.com/docs/clustering#creating). Data lives in the container, so a killed
and restarted node keeps its identity and rejoins by itself; :meth:`Cluster.stop` removes it.

The nodes talk over an internal Docker network of their own; clients reach them through the
published ports on Docker's default bridge. :meth:`Cluster.disconnect` cuts one node off the
others while its clients keep their connections (the minority side of a partition), and
:meth:`Cluster.pause` freezes one (docs/cluster.md#partitions).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from amqp_lab.errors import ManagementError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from lab.cluster_nodes import ClusterError, ClusterNode, NodeContainers, NodeStatus

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_NAME",
    "PARTITION_TIMERS",
    "Cluster",
    "ClusterError",
    "ClusterNode",
    "NodeStatus",
]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_IMAGE = "amqp-lab/rabbitmq:sid"
DEFAULT_NAME = "amqp-lab-cluster"
PARTITION_TIMERS = ROOT / "lab" / "partition_timers.conf"
"""Shorter failure detection for the partition chaos (docs/cluster.md#partitions)."""

NodeRef = str | int | ClusterNode
"""A node: a ClusterNode, its index (1, "1"), hostname ("rmq1"), node name ("rabbit@rmq1")
or container name."""


class Cluster:
    """A ``size``-node cluster named ``name`` (the Docker network; containers ``name-rmqN``).

    Ports: node N gets ``amqp_port + N - 1`` and ``management_port + N - 1``. Timeouts are in
    seconds. ``extra_config``: a rabbitmq.conf fragment each new node reads after
    ``config_file`` (e.g. :data:`PARTITION_TIMERS`). Methods raise :class:`ClusterError` when
    Docker does not answer or a wait times out, and ManagementError when no node's management
    API answers.
    """

    def __init__(
        self,
        size: int = 3,
        image: str = DEFAULT_IMAGE,
        amqp_port: int = 5701,
        management_port: int = 15701,
        name: str = DEFAULT_NAME,
        cookie: str = "amqp-lab-cluster-cookie",
        config_file: Path = ROOT / "rabbitmq.conf",
        username: str = "guest",
        password: str = "guest",
        extra_config: Path | None = None,
    ) -> None:
        if size < 1:
            raise ClusterError(f"a cluster needs at least one node, not {size}")
        self.image, self.name, self.cookie = image, name, cookie
        self.config_file, self.username, self.password = config_file, username, password
        self.extra_config = extra_config
        self.nodes: tuple[ClusterNode, ...] = tuple(
            ClusterNode(i, f"rmq{i}", f"{name}-rmq{i}", amqp_port + i - 1, management_port + i - 1)
            for i in range(1, size + 1)
        )
        self.containers = NodeContainers(name, image)

    # --- addresses -----------------------------------------------------------------------------
    def node(self, ref: NodeRef) -> ClusterNode:
        """The node named by ``ref`` (see NodeRef). Raises ClusterError for anything else."""
        if isinstance(ref, ClusterNode):
            return ref
        for node in self.nodes:
            if str(ref) in (str(node.index), node.hostname, node.nodename, node.container):
                return node
        known = ", ".join(n.hostname for n in self.nodes)
        raise ClusterError(f"no cluster node {ref!r}: choose one of {known}")

    def node_for(self, nodename: str) -> ClusterNode:
        """The node whose Erlang node name is ``nodename`` (e.g. a queue leader's)."""
        return self.node(nodename)

    def amqp_urls(self, vhost: str = "/") -> tuple[str, ...]:
        return tuple(n.amqp_url(vhost, self.username, self.password) for n in self.nodes)

    def management_urls(self) -> tuple[str, ...]:
        return tuple(n.management_url for n in self.nodes)

    def settings(self, vhost: str = "/", **overrides: Any) -> BrokerSettings:
        """BrokerSettings naming every node: the comma-separated AMQP and management URL lists
        (the several-address form of EAI_AMQP_URL / EAI_MGMT_URL)."""
        return BrokerSettings(
            amqp_url=",".join(self.amqp_urls(vhost)),
            management_url=",".join(self.management_urls()),
            **overrides,
        )

    def node_settings(self, node: NodeRef, vhost: str = "/", **overrides: Any) -> BrokerSettings:
        """BrokerSettings for one node only (single AMQP URL and management base)."""
        n = self.node(node)
        url = n.amqp_url(vhost, self.username, self.password)
        return BrokerSettings(url, n.management_url, **overrides)

    # --- inside a node -------------------------------------------------------------------------
    def state(self, node: NodeRef) -> str:
        """The node's container state: ``running``, ``exited``, ``created``... or ``absent``."""
        return self.containers.state(self.node(node))

    def running_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if self.state(n) == "running"]

    def ctl(self, node: NodeRef, *args: str, tool: str = "rabbitmqctl") -> str:
        """Run ``tool ARGS`` (rabbitmqctl, rabbitmq-queues, rabbitmq-diagnostics) inside the
        node's container (docker exec); return its output. ClusterError on a non-zero exit or
        when the node is not running."""
        return self.containers.exec(self.node(node), [tool, *args])

    def quorum_status(
        self, vhost: str, queue: str, node: NodeRef | None = None
    ) -> list[dict[str, Any]]:
        """``rabbitmq-queues quorum_status QUEUE --vhost VHOST --formatter json`` on ``node``
        (default: the first running node): one dict per member with ``Node Name``, ``Raft
        State`` (leader, follower; ``noconnection`` with empty indexes for a member that is
        down), ``Membership``, ``Commit Index``, ``Last Applied``, ``Last Written``, ``Term``
        (RabbitMQ 4.3's field names)."""
        if node is None:
            running = self.running_nodes()
            if not running:
                raise ClusterError("quorum_status: no cluster node is running")
            node = running[0]
        args = ("quorum_status", queue, "--vhost", vhost, "--formatter", "json")
        text = self.ctl(node, *args, tool="rabbitmq-queues")
        try:
            members = json.loads(text[text.index("[") :])
        except ValueError as e:
            raise ClusterError(f"quorum_status {queue}: unexpected output {text[:200]!r}") from e
        return [dict(m) for m in members]

    def node_log(self, node: NodeRef, needle: str, since: float) -> str:
        """The node's log lines that contain ``needle`` (lab.cluster_nodes, ``log_lines``)."""
        return self.containers.log_lines(self.node(node), needle, since)

    # --- management API ------------------------------------------------------------------------
    def members_seen(self, node: NodeRef, running: bool = True) -> tuple[str, ...]:
        """The members the node's own management API lists (GET /api/nodes), sorted: only
        those it sees running, or with ``running=False`` every member, down ones too; () when
        that node's management API does not answer."""
        try:
            with ManagementClient(self.node_settings(node), timeout=3) as api:
                listed = api.nodes()
        except ManagementError:
            return ()
        return tuple(sorted(n["name"] for n in listed if n.get("running") or not running))

    def management(self, call: Callable[[ManagementClient], Any]) -> Any:
        """``call(client)`` with a ManagementClient over every node's management API (it moves
        on from a node that does not answer)."""
        with ManagementClient(self.settings(), timeout=5) as api:
            return call(api)

    def queue_info(self, vhost: str, queue: str) -> dict[str, Any] | None:
        """GET /api/queues/{vhost}/{queue} from any live node; None when the queue is absent.
        A quorum queue's info has ``leader``, ``members`` and ``online`` (node names)."""
        info: dict[str, Any] | None = self.management(lambda api: api.queue(vhost, queue))
        return info

    def queue_leader(self, vhost: str, queue: str) -> str | None:
        """The node name hosting the quorum queue's leader (management API ``leader`` field),
        or None when the queue is absent or reports no leader yet."""
        info = self.queue_info(vhost, queue)
        leader = None if info is None else info.get("leader")
        return str(leader) if leader else None

    def wait_queue_online(self, vhost: str, queue: str, timeout: float = 60) -> dict[str, Any]:
        """Poll the management API until the quorum queue has every node as a member, all of
        them ``online``, and a leader; its info. ClusterError after ``timeout`` seconds."""
        want = sorted(n.nodename for n in self.nodes)
        found: dict[str, Any] = {}

        def online() -> bool:
            info = self.queue_info(vhost, queue) or {}
            found.clear()
            found.update(info)
            members, up = sorted(info.get("members", [])), sorted(info.get("online", []))
            return members == want == up and bool(info.get("leader"))

        _poll(online, time.monotonic() + timeout, f"{queue} has {want} online", 0.25)
        return found

    def wait_new_leader(self, vhost: str, queue: str, old: str, timeout: float = 60) -> str:
        """Poll the management API until the quorum queue names a leader other than ``old``
        (a node name); that leader. ClusterError after ``timeout`` seconds."""
        leader: list[str] = []

        def elected() -> bool:
            name = self.queue_leader(vhost, queue)
            leader[:] = [name] if name else []
            return name not in (None, old)

        _poll(elected, time.monotonic() + timeout, f"{queue} has a leader other than {old}", 0.1)
        return leader[0]

    # --- lifecycle -----------------------------------------------------------------------------
    def is_clustered(self) -> bool:
        """True when every node's container runs and every node lists all nodes as running."""
        want = tuple(sorted(n.nodename for n in self.nodes))
        return all(self.state(n) == "running" and self.members_seen(n) == want for n in self.nodes)

    def start(self, timeout: float = 240) -> bool:
        """Create what is missing (network, containers), start stopped containers, join new
        nodes to node 1, and wait until all nodes run in one cluster. Returns False when the
        cluster was already up (nothing done). Raises ClusterError on a taken port, a missing
        image, or when the cluster is not formed within ``timeout`` seconds."""
        if self.is_clustered():
            return False
        deadline = time.monotonic() + timeout
        self.containers.ensure_image()
        for node in self.nodes:
            if self.containers.get(node) is None:
                for port in (node.amqp_port, node.management_port):
                    if _port_open(port):
                        raise ClusterError(f"port 127.0.0.1:{port} for {node.nodename} is taken")
                self.containers.create(node, self.cookie, self.config_file, self.extra_config)
            else:
                self.containers.start(node)
        for node in self.nodes:
            _poll(partial(self.members_seen, node), deadline, f"{node.nodename} boots")
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self._join(node, first, deadline)
        _poll(self.is_clustered, deadline, "all nodes run in one cluster")
        return True

    def _join(self, node: ClusterNode, first: ClusterNode, deadline: float) -> None:
        """``stop_app``, ``join_cluster first``, ``start_app`` on ``node`` unless it is a
        member already, then wait until it lists ``first`` among its members. A step that
        fails is tried again, up to 3 times and not past ``deadline`` (CI saw ``join_cluster``
        killed, exit 137, on a loaded machine): the container is started again if it
        stopped, and the node booted, before the next try. ClusterError otherwise."""

        def member() -> bool:
            return first.nodename in self.members_seen(node, running=False)

        if member():
            return
        for attempt in range(1, 4):
            try:
                self.ctl(node, "stop_app")
                self.ctl(node, "join_cluster", first.nodename)
                self.ctl(node, "start_app")
                break
            except ClusterError as e:
                if attempt == 3 or time.monotonic() > deadline:
                    raise
                print(f"{node.nodename}: {e}; trying again", file=sys.stderr)
                self.containers.start(node)
                with contextlib.suppress(ClusterError):
                    self.ctl(node, "start_app")  # its app may be stopped: its API with it
                _poll(partial(self.members_seen, node), deadline, f"{node.nodename} boots")
                if member():
                    return  # the join went through before the step that failed
        _poll(member, deadline, f"{node.nodename} lists {first.nodename} as a member")

    def kill(self, node: NodeRef, timeout: float = 30) -> None:
        """SIGKILL the node's container (``docker kill``): a crash, no clean shutdown. Returns
        once Docker reports the container stopped."""
        n = self.node(node)
        self.containers.kill(n)
        _poll(lambda: self.state(n) != "running", time.monotonic() + timeout, f"{n.container} dies")

    def restart(self, node: NodeRef, timeout: float = 180) -> bool:
        """Start a killed or stopped node's container again (same data) and wait until every
        running node, itself included, lists it as a running member. Returns False when it
        was running already (nothing done, no wait)."""
        n = self.node(node)
        if self.state(n) == "running":
            return False
        self.containers.start(n)

        def rejoined() -> bool:
            return all(n.nodename in self.members_seen(m) for m in self.running_nodes())

        _poll(rejoined, time.monotonic() + timeout, f"{n.nodename} is back in the cluster")
        return True

    def disconnect(self, node: NodeRef) -> None:
        """Cut the node off from the others: ``docker network disconnect`` from the cluster
        network (lab.cluster_nodes.NodeContainers.disconnect). Clients still reach it."""
        self.containers.disconnect(self.node(node))

    def reconnect(self, node: NodeRef) -> bool:
        """``docker network connect`` the node again (alias ``rmqN``); False when it was
        connected already. Returns at once: the nodes find each other again by themselves."""
        return self.containers.connect(self.node(node))

    def pause(self, node: NodeRef) -> None:
        """Freeze the node (``docker pause``)."""
        self.containers.pause(self.node(node))

    def unpause(self, node: NodeRef) -> bool:
        """Thaw a frozen node (``docker unpause``); False when it was not paused."""
        return self.containers.unpause(self.node(node))

    def client_paths_survive_a_cut(self) -> bool:
        """Whether cutting a node off the cluster network leaves its client connections up:
        the network is internal (a cluster created before it was is not: stop and start it)."""
        return bool(self.containers.network_internal())

    def heal(self) -> list[str]:
        """Unpause every paused node and reconnect every cut-off one (an interrupted partition
        run leaves them so); the node names it healed."""
        healed = []
        for node in self.nodes:
            state = self.state(node)
            if state == "paused" and self.unpause(node):
                healed.append(node.nodename)
            if self.state(node) == "running" and self.reconnect(node):
                healed.append(node.nodename)
        return healed

    def stop(self) -> None:
        """Remove the containers (with their volumes) and the network, paused ones too.
        Nothing there is fine."""
        for node in self.nodes:
            self.containers.unpause(node)
        self.containers.remove(self.nodes)

    def status(self) -> list[NodeStatus]:
        """Each node's container state and the cluster members it sees."""
        result = []
        for node in self.nodes:
            state = self.state(node)
            members = self.members_seen(node) if state == "running" else ()
            result.append(NodeStatus(node, state, members))
        return result


def _poll(check: Callable[[], object], deadline: float, what: str, interval: float = 0.5) -> None:
    """Call ``check`` until it returns something truthy; ClusterError at ``deadline``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() > deadline:
            waited = time.monotonic() - started
            raise ClusterError(f"timed out after {waited:.0f}s waiting until {what}")
        time.sleep(interval)


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
