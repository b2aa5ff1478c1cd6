"""A three-node RabbitMQ cluster on one machine: Docker containers on one Docker network.

Each node is a container from the locally built image (``scripts/build_test_image.sh sid
amqp-lab/rabbitmq:sid``: RabbitMQ 4.3, management plugin enabled, guest allowed from outside
the container) with ``--hostname rmqN``, ``RABBITMQ_NODENAME=rabbit@rmqN``, one shared
``RABBITMQ_ERLANG_COOKIE`` and our ``rabbitmq.conf`` mounted read-only. AMQP (5672) and the
management API (15672) are published on 127.0.0.1 (defaults 5701.. and 15701..). Nodes 2..N
join node 1 with ``rabbitmqctl stop_app``, ``join_cluster rabbit@rmq1``, ``start_app``
(https://www.rabbitmq.com/docs/clustering#creating). Data lives in the container, so a killed
and restarted node keeps its identity and rejoins by itself; :meth:`Cluster.stop` removes it.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from amqp_lab.errors import AmqpLabError, ManagementError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_IMAGE = "amqp-lab/rabbitmq:sid"
DEFAULT_NAME = "amqp-lab-cluster"
LABEL = "amqp-lab.cluster"


class ClusterError(AmqpLabError):
    """The cluster could not be started, reached, or did not reach the wanted state in time."""


@dataclass(frozen=True)
class ClusterNode:
    """One node: container ``container`` with hostname ``hostname`` (node ``rabbit@hostname``),
    AMQP on 127.0.0.1:``amqp_port``, management API on 127.0.0.1:``management_port``."""

    index: int
    hostname: str
    container: str
    amqp_port: int
    management_port: int

    @property
    def nodename(self) -> str:
        """The Erlang node name, as the management API and rabbitmqctl print it."""
        return f"rabbit@{self.hostname}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    def amqp_url(self, vhost: str = "/", username: str = "guest", password: str = "guest") -> str:
        user, pw = quote(username, safe=""), quote(password, safe="")
        return f"amqp://{user}:{pw}@127.0.0.1:{self.amqp_port}/{quote(vhost, safe='')}"


@dataclass(frozen=True)
class NodeStatus:
    """``state``: the container's state (``running``, ``exited``, ... or ``absent``);
    ``members``: the running cluster members this node's management API lists (empty when
    it does not answer)."""

    node: ClusterNode
    state: str
    members: tuple[str, ...]


class Cluster:
    """A ``size``-node cluster named ``name`` (the Docker network; containers ``name-rmqN``).

    Ports: node N gets ``amqp_port + N - 1`` and ``management_port + N - 1``. Timeouts are in
    seconds. Every method raises :class:`ClusterError` when Docker does not answer.
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
    ) -> None:
        if size < 1:
            raise ClusterError(f"a cluster needs at least one node, not {size}")
        self.image, self.name, self.cookie = image, name, cookie
        self.config_file, self.username, self.password = config_file, username, password
        self.nodes: tuple[ClusterNode, ...] = tuple(
            ClusterNode(i, f"rmq{i}", f"{name}-rmq{i}", amqp_port + i - 1, management_port + i - 1)
            for i in range(1, size + 1)
        )
        self._docker: Any = None

    # --- addresses -----------------------------------------------------------------------------
    def node(self, ref: str | int | ClusterNode) -> ClusterNode:
        """The node named by ``ref``: a ClusterNode, its index (1, "1"), hostname ("rmq1"),
        node name ("rabbit@rmq1") or container name. Raises ClusterError for anything else."""
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

    def node_settings(self, node: str | int | ClusterNode, vhost: str = "/") -> BrokerSettings:
        """BrokerSettings for one node only (single AMQP URL and management base)."""
        n = self.node(node)
        return BrokerSettings(n.amqp_url(vhost, self.username, self.password), n.management_url)

    # --- docker plumbing -----------------------------------------------------------------------
    def _client(self) -> Any:
        if self._docker is None:
            import docker

            try:
                client = docker.from_env(timeout=30)
                client.ping()
            except docker.errors.DockerException as e:
                raise ClusterError(f"Docker is not reachable: {e}") from e
            self._docker = client
        return self._docker

    @contextmanager
    def _docker_errors(self, doing: str) -> Iterator[None]:
        import docker

        try:
            yield
        except docker.errors.DockerException as e:
            raise ClusterError(f"{doing}: {' '.join(str(e).split())}") from e

    def _container(self, node: ClusterNode) -> Any | None:
        import docker

        with self._docker_errors(f"inspecting container {node.container}"):
            try:
                return self._client().containers.get(node.container)
            except docker.errors.NotFound:
                return None

    def state(self, node: str | int | ClusterNode) -> str:
        """The node's container state: ``running``, ``exited``, ``created``... or ``absent``."""
        container = self._container(self.node(node))
        return "absent" if container is None else str(container.status)

    def ctl(self, node: str | int | ClusterNode, *args: str, tool: str = "rabbitmqctl") -> str:
        """Run ``tool ARGS`` (rabbitmqctl, rabbitmq-queues, rabbitmq-diagnostics) inside the
        node's container; return its output. Raises ClusterError on a non-zero exit."""
        n = self.node(node)
        container = self._container(n)
        if container is None or container.status != "running":
            raise ClusterError(f"{tool} {' '.join(args)}: node {n.nodename} is not running")
        with self._docker_errors(f"{tool} on {n.nodename}"):
            code, output = container.exec_run([tool, *args])
        text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
        if code != 0:
            tail = " ".join(text.split())[-400:]
            raise ClusterError(f"{tool} {' '.join(args)} on {n.nodename} exited {code}: {tail}")
        return text

    # --- management API ------------------------------------------------------------------------
    def members_seen(self, node: str | int | ClusterNode) -> tuple[str, ...]:
        """The running members the node's management API lists (GET /api/nodes); () when the
        node's management API does not answer."""
        try:
            with ManagementClient(self.node_settings(node), timeout=3) as api:
                return tuple(sorted(n["name"] for n in api.nodes() if n.get("running")))
        except ManagementError:
            return ()

    def management(self, call: Callable[[ManagementClient], Any]) -> Any:
        """``call(client)`` on the first node whose management API answers. Raises
        ClusterError when none does; a 4xx ManagementError propagates (a 5xx tries the next)."""
        last: ManagementError | None = None
        for node in self.nodes:
            try:
                with ManagementClient(self.node_settings(node), timeout=5) as api:
                    return call(api)
            except ManagementError as e:
                if e.status_code is not None and e.status_code < 500:
                    raise
                last = e
        raise ClusterError(f"no cluster node's management API answers ({last})")

    def queue_info(self, vhost: str, queue: str) -> dict[str, Any] | None:
        """GET /api/queues/{vhost}/{queue} from any live node; None when the queue is absent."""
        info: dict[str, Any] | None = self.management(lambda api: api.queue(vhost, queue))
        return info

    def queue_leader(self, vhost: str, queue: str) -> str | None:
        """The node name hosting the quorum queue's leader (management API ``leader`` field),
        or None when the queue is absent or reports no leader yet."""
        info = self.queue_info(vhost, queue)
        leader = None if info is None else info.get("leader")
        return str(leader) if leader else None

    def quorum_status(
        self, vhost: str, queue: str, node: str | int | ClusterNode | None = None
    ) -> list[dict[str, Any]]:
        """``rabbitmq-queues quorum_status QUEUE --vhost VHOST --formatter json`` on ``node``
        (default: the first running node): one dict per member with ``Node Name``, ``Raft
        State`` (leader, follower, ...), ``Membership``, ``Commit Index``, ``Last Applied``,
        ``Last Written``, ``Term`` (RabbitMQ 4.3 field names)."""
        if node is None:
            running = [n for n in self.nodes if self.state(n) == "running"]
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

    # --- lifecycle -----------------------------------------------------------------------------
    def _answers(self, node: ClusterNode) -> bool:
        return bool(self.members_seen(node))

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
        client = self._client()
        self._ensure_image(client)
        network = self._ensure_network(client)
        for node in self.nodes:
            container = self._container(node)
            if container is None:
                self._create(client, network, node)
            elif container.status != "running":
                with self._docker_errors(f"starting {node.container}"):
                    container.start()
        for node in self.nodes:
            _poll(partial(self._answers, node), deadline, f"{node.nodename} boots")
        first = self.nodes[0]
        for node in self.nodes[1:]:
            if first.nodename not in self.members_seen(node):
                self.ctl(node, "stop_app")
                self.ctl(node, "join_cluster", first.nodename)
                self.ctl(node, "start_app")
        _poll(self.is_clustered, deadline, "all nodes run in one cluster")
        return True

    def _ensure_image(self, client: Any) -> None:
        import docker

        with self._docker_errors(f"looking up image {self.image}"):
            try:
                client.images.get(self.image)
            except docker.errors.ImageNotFound as e:
                raise ClusterError(
                    f"image {self.image} is absent: build it with "
                    f"scripts/build_test_image.sh sid {self.image}"
                ) from e

    def _ensure_network(self, client: Any) -> Any:
        with self._docker_errors(f"creating network {self.name}"):
            found = client.networks.list(names=[self.name])
            if found:
                return found[0]
            return client.networks.create(self.name, driver="bridge", labels={LABEL: self.name})

    def _create(self, client: Any, network: Any, node: ClusterNode) -> None:
        for port in (node.amqp_port, node.management_port):
            if _port_open(port):
                raise ClusterError(f"port 127.0.0.1:{port} for {node.nodename} is already taken")
        with self._docker_errors(f"creating {node.container}"):
            container = client.containers.create(
                self.image,
                name=node.container,
                hostname=node.hostname,
                environment={
                    "RABBITMQ_NODENAME": node.nodename,
                    "RABBITMQ_ERLANG_COOKIE": self.cookie,
                },
                volumes={
                    str(self.config_file): {"bind": "/etc/rabbitmq/rabbitmq.conf", "mode": "ro"}
                },
                ports={
                    "5672/tcp": ("127.0.0.1", node.amqp_port),
                    "15672/tcp": ("127.0.0.1", node.management_port),
                },
                labels={LABEL: self.name},
                detach=True,
            )
            network.connect(container, aliases=[node.hostname])
            container.start()

    def kill(self, node: str | int | ClusterNode, timeout: float = 30) -> None:
        """SIGKILL the node's container (``docker kill``): a crash, no clean shutdown."""
        n = self.node(node)
        container = self._container(n)
        if container is None or container.status != "running":
            raise ClusterError(f"node {n.nodename} is not running ({self.state(n)})")
        with self._docker_errors(f"killing {n.container}"):
            container.kill(signal="SIGKILL")
        _poll(lambda: self.state(n) != "running", time.monotonic() + timeout, f"{n.container} dies")

    def restart(self, node: str | int | ClusterNode, timeout: float = 180) -> None:
        """Start a killed or stopped node's container again (same data) and wait until every
        node lists it as a running member. A running node is left as it is."""
        n = self.node(node)
        container = self._container(n)
        if container is None:
            raise ClusterError(f"node {n.nodename} has no container: run start")
        if container.status != "running":
            with self._docker_errors(f"starting {n.container}"):
                container.start()
        deadline = time.monotonic() + timeout

        def rejoined() -> bool:
            return all(
                n.nodename in self.members_seen(m) for m in self.nodes if self.state(m) == "running"
            )

        _poll(rejoined, deadline, f"{n.nodename} is back in the cluster")

    def stop(self) -> None:
        """Remove the containers (with their volumes) and the network. Nothing there is fine."""
        for node in self.nodes:
            container = self._container(node)
            if container is not None:
                with self._docker_errors(f"removing {node.container}"):
                    container.remove(force=True, v=True)
        with self._docker_errors(f"removing network {self.name}"):
            for network in self._client().networks.list(names=[self.name]):
                network.remove()

    def status(self) -> list[NodeStatus]:
        """Each node's container state and the cluster members it sees."""
        result = []
        for node in self.nodes:
            state = self.state(node)
            members = self.members_seen(node) if state == "running" else ()
            result.append(NodeStatus(node, state, members))
        return result


def _poll(check: Callable[[], bool], deadline: float, what: str, interval: float = 0.5) -> None:
    """Call ``check`` until it returns True; ClusterError naming ``what`` at ``deadline``."""
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
