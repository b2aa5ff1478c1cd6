"""The nodes of the lab's RabbitMQ cluster and their Docker containers (docker SDK).

:class:`ClusterNode` is one node's identity and addresses; :class:`NodeContainers` creates,
starts, kills, execs in and removes the node containers of one cluster, on one Docker network
where each container answers to its hostname (``rmqN``, a network alias), so the Erlang
distribution between ``rabbit@rmq1``, ``rabbit@rmq2``... resolves. That network is internal:
clients come in through ports published on Docker's default bridge, a path of their own, so a
node cut off the cluster network (:meth:`NodeContainers.disconnect`) still serves its clients.
Every Docker failure becomes a :class:`ClusterError` naming what was being done.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from amqp_lab.errors import AmqpLabError

LABEL = "amqp-lab.cluster"
AMQP_PORT, MANAGEMENT_PORT = 5672, 15672  # inside each container
CONF_D = "/etc/rabbitmq/conf.d"


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
        """``amqp://user:pass@127.0.0.1:PORT/VHOST`` (vhost percent-encoded: ``/`` is %2F)."""
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


@contextmanager
def docker_errors(doing: str) -> Iterator[None]:
    """Turn a docker SDK error inside the block into ClusterError("{doing}: ...")."""
    import docker

    try:
        yield
    except docker.errors.DockerException as e:
        raise ClusterError(f"{doing}: {' '.join(str(e).split())}") from e


class NodeContainers:
    """The containers of cluster ``network`` (also the Docker network's name), from ``image``.
    The Docker engine is reached lazily (``DOCKER_HOST`` etc., as the docker CLI does)."""

    def __init__(self, network: str, image: str) -> None:
        self.network, self.image = network, image
        self._docker: Any = None

    def client(self) -> Any:
        """The docker SDK client; ClusterError when no Docker engine answers."""
        if self._docker is None:
            import docker

            with docker_errors("Docker is not reachable"):
                client = docker.from_env(timeout=30)
                client.ping()
            self._docker = client
        return self._docker

    def get(self, node: ClusterNode) -> Any | None:
        """The node's container, or None when it does not exist."""
        import docker

        with docker_errors(f"inspecting container {node.container}"):
            try:
                return self.client().containers.get(node.container)
            except docker.errors.NotFound:
                return None

    def state(self, node: ClusterNode) -> str:
        """``running``, ``exited``, ``created``... or ``absent``."""
        container = self.get(node)
        return "absent" if container is None else str(container.status)

    def running(self, node: ClusterNode) -> Any:
        """The node's container; ClusterError when it is absent or not running."""
        container = self.get(node)
        if container is None or container.status != "running":
            raise ClusterError(f"node {node.nodename} is not running ({self.state(node)})")
        return container

    def exec(self, node: ClusterNode, argv: list[str]) -> str:
        """Run ``argv`` in the node's container; its stdout (stderr apart, so a CLI warning
        never mixes into JSON output). ClusterError with the output's tail on a non-zero exit."""
        container = self.running(node)
        with docker_errors(f"{argv[0]} on {node.nodename}"):
            code, (stdout, stderr) = container.exec_run(argv, demux=True)
        out, err = (b.decode(errors="replace") if b else "" for b in (stdout, stderr))
        if code != 0:
            tail = " ".join((out + " " + err).split())[-400:]
            raise ClusterError(f"{' '.join(argv)} on {node.nodename} exited {code}: {tail}")
        return out

    def log_lines(self, node: ClusterNode, needle: str, since: float) -> str:
        """The lines of the node's log that contain ``needle``: its log file (our image:
        ``/var/log/rabbitmq/NODENAME.log``, grep), or else what it wrote to its standard
        output since ``since`` (epoch seconds; the official images log there)."""
        container = self.running(node)
        path = f"/var/log/rabbitmq/{node.nodename}.log"
        with docker_errors(f"reading the log of {node.nodename}"):
            code, out = container.exec_run(["grep", "-F", "-e", needle, path])
            if code in (0, 1):  # 1: no line matched
                return str(out.decode(errors="replace"))
            logs = container.logs(since=int(since) - 1).decode(errors="replace")
        return "\n".join(line for line in logs.splitlines() if needle in line)

    def ensure_image(self) -> None:
        """ClusterError saying how to build the image when it is absent."""
        import docker

        with docker_errors(f"looking up image {self.image}"):
            try:
                self.client().images.get(self.image)
            except docker.errors.ImageNotFound as e:
                raise ClusterError(
                    f"image {self.image} is absent: build it with "
                    f"scripts/build_test_image.sh sid {self.image}"
                ) from e

    def network_internal(self) -> bool | None:
        """Whether the cluster network is internal (None: it does not exist)."""
        with docker_errors(f"inspecting network {self.network}"):
            found = self.client().networks.list(names=[self.network])
        return None if not found else bool(found[0].attrs.get("Internal"))

    def ensure_network(self) -> Any:
        """The cluster's bridge network, created when missing: ``internal``, so Docker never
        routes the published ports through it (they go through its default bridge) and
        cutting a node off this network leaves its client connections up."""
        with docker_errors(f"creating network {self.network}"):
            found = self.client().networks.list(names=[self.network])
            if found:
                return found[0]
            return self.client().networks.create(
                self.network, driver="bridge", internal=True, labels={LABEL: self.network}
            )

    def create(
        self, node: ClusterNode, cookie: str, config_file: Path, extra_config: Path | None = None
    ) -> None:
        """Create and start the node's container: ``--hostname``, RABBITMQ_NODENAME, the shared
        RABBITMQ_ERLANG_COOKIE, ``config_file`` mounted read-only as rabbitmq.conf (and
        ``extra_config``, when given, as ``conf.d/90-amqp-lab.conf``: RabbitMQ reads the
        files of conf.d after rabbitmq.conf, https://www.rabbitmq.com/docs/configure#config-confd-directory),
        ports published on 127.0.0.1 (through Docker's default bridge network, which the
        container joins first), and the hostname as its alias on the cluster network (the
        Erlang distribution's only path between the nodes)."""
        network = self.ensure_network()
        volumes = {str(config_file): {"bind": "/etc/rabbitmq/rabbitmq.conf", "mode": "ro"}}
        if extra_config is not None:
            volumes[str(extra_config)] = {"bind": CONF_D + "/90-amqp-lab.conf", "mode": "ro"}
        with docker_errors(f"creating {node.container}"):
            container = self.client().containers.create(
                self.image,
                name=node.container,
                hostname=node.hostname,
                environment={"RABBITMQ_NODENAME": node.nodename, "RABBITMQ_ERLANG_COOKIE": cookie},
                volumes=volumes,
                ports={
                    f"{AMQP_PORT}/tcp": ("127.0.0.1", node.amqp_port),
                    f"{MANAGEMENT_PORT}/tcp": ("127.0.0.1", node.management_port),
                },
                labels={LABEL: self.network},
                detach=True,
            )
            network.connect(container, aliases=[node.hostname])
            container.start()

    def start(self, node: ClusterNode) -> None:
        """Start the node's existing container (a killed or stopped node keeps its data)."""
        container = self.get(node)
        if container is None:
            raise ClusterError(f"node {node.nodename} has no container: run start")
        if container.status != "running":
            with docker_errors(f"starting {node.container}"):
                container.start()

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL the node's container (``docker kill``)."""
        container = self.running(node)
        with docker_errors(f"killing {node.container}"):
            container.kill(signal="SIGKILL")

    def disconnect(self, node: ClusterNode) -> None:
        """``docker network disconnect`` the node's container from the cluster network: its
        Erlang distribution links to the other nodes go silent (no reset: each side finds out
        by the net tick timeout), while clients still reach it through its published ports."""
        container = self.running(node)
        with docker_errors(f"disconnecting {node.container} from {self.network}"):
            self.ensure_network().disconnect(container)

    def connect(self, node: ClusterNode) -> bool:
        """``docker network connect`` the node's container to the cluster network again, with
        its hostname as alias; False when it was connected already (nothing done)."""
        container = self.running(node)
        if self.network in self.networks_of(node):
            return False
        with docker_errors(f"connecting {node.container} to {self.network}"):
            self.ensure_network().connect(container, aliases=[node.hostname])
        return True

    def networks_of(self, node: ClusterNode) -> list[str]:
        """The Docker networks the node's container is attached to ([] when it is absent)."""
        container = self.get(node)
        if container is None:
            return []
        return sorted((container.attrs.get("NetworkSettings") or {}).get("Networks") or {})

    def pause(self, node: ClusterNode) -> None:
        """``docker pause``: freeze every process of the node (cgroup freezer). Its kernel still
        accepts TCP connections and buffers what peers and clients send; nothing answers."""
        container = self.running(node)
        with docker_errors(f"pausing {node.container}"):
            container.pause()

    def unpause(self, node: ClusterNode) -> bool:
        """``docker unpause``; False when the container was not paused (nothing done)."""
        container = self.get(node)
        if container is None or container.status != "paused":
            return False
        with docker_errors(f"unpausing {node.container}"):
            container.unpause()
        return True

    def remove(self, nodes: tuple[ClusterNode, ...], timeout: float = 60) -> None:
        """Remove the nodes' containers (with their volumes) and the network, where present.
        A container another removal has under way (the engine answers 409 "removal ... is
        already in progress"; CI saw one as a test cluster was stopped and started again) or
        that went meanwhile (404) is waited for until it is gone, ``timeout`` seconds at most
        for each node (ClusterError after)."""
        import docker

        for node in nodes:
            container = self.get(node)
            if container is None:
                continue
            with docker_errors(f"removing {node.container}"):
                try:
                    container.remove(force=True, v=True)
                except docker.errors.APIError as e:
                    if e.status_code != 404 and "already in progress" not in str(e):
                        raise
            deadline = time.monotonic() + timeout
            while self.get(node) is not None:
                if time.monotonic() > deadline:
                    raise ClusterError(f"removing {node.container}: still there after {timeout} s")
                time.sleep(0.2)
        with docker_errors(f"removing network {self.network}"):
            for network in self.client().networks.list(names=[self.network]):
                network.remove()
