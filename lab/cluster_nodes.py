"""The nodes of the lab's RabbitMQ cluster and their Docker containers (docker SDK).

:class:`ClusterNode` is one node's identity and addresses; :class:`NodeContainers` creates,
starts, kills, execs in and removes the node containers of one cluster, on one Docker network
where each container answers to its hostname (``rmqN``, a network alias), so the Erlang
distribution between ``rabbit@rmq1``, ``rabbit@rmq2``... resolves.
Every Docker failure becomes a :class:`ClusterError` naming what was being done.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from amqp_lab.errors import AmqpLabError

LABEL = "amqp-lab.cluster"
AMQP_PORT, MANAGEMENT_PORT = 5672, 15672  # inside each container


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

    def ensure_network(self) -> Any:
        """The cluster's bridge network, created when missing."""
        with docker_errors(f"creating network {self.network}"):
            found = self.client().networks.list(names=[self.network])
            if found:
                return found[0]
            return self.client().networks.create(
                self.network, driver="bridge", labels={LABEL: self.network}
            )

    def create(self, node: ClusterNode, cookie: str, config_file: Path) -> None:
        """Create and start the node's container: ``--hostname``, RABBITMQ_NODENAME, the shared
        RABBITMQ_ERLANG_COOKIE, ``config_file`` mounted read-only as rabbitmq.conf, ports
        published on 127.0.0.1, and the hostname as its alias on the cluster network."""
        network = self.ensure_network()
        with docker_errors(f"creating {node.container}"):
            container = self.client().containers.create(
                self.image,
                name=node.container,
                hostname=node.hostname,
                environment={"RABBITMQ_NODENAME": node.nodename, "RABBITMQ_ERLANG_COOKIE": cookie},
                volumes={str(config_file): {"bind": "/etc/rabbitmq/rabbitmq.conf", "mode": "ro"}},
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

    def remove(self, nodes: tuple[ClusterNode, ...]) -> None:
        """Remove the nodes' containers (with their volumes) and the network, where present."""
        for node in nodes:
            container = self.get(node)
            if container is not None:
                with docker_errors(f"removing {node.container}"):
                    container.remove(force=True, v=True)
        with docker_errors(f"removing network {self.network}"):
            for network in self.client().networks.list(names=[self.network]):
                network.remove()
