"""Test brokers: one RabbitMQ for the whole test session, chosen in this order.

1. ``EAI_AMQP_URL`` is set: that existing broker (restart tests skip: we cannot restart it).
2. A Docker engine is reachable: testcontainers' RabbitMqContainer with our rabbitmq.conf
   mounted. Image: ``AMQP_LAB_RABBITMQ_IMAGE`` if set, else for ``AMQP_LAB_RABBITMQ_VERSION``
   (4.3 by default - the version users run and CI runs the whole suite on - or 4.0, or 3.10)
   the official ``rabbitmq:<version>-management`` if present or pullable, else the locally
   built ``amqp-lab/rabbitmq:sid`` / ``:trixie`` / ``:bookworm`` (RabbitMQ 4.3 / 4.0 / 3.10
   from that Debian suite), which is built on the spot (scripts/build_test_image.sh) when it
   does not exist yet; if that fails too, the dedicated local node (3. below), with a visible
   warning.
3. Otherwise a dedicated local node from the OS's rabbitmq-server (lab.local_broker; 3.10 on
   this project's machines, whatever version was asked for), with a visible warning.

``AMQP_LAB_TEST_BROKER=env|testcontainers|local`` forces one of them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest

from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings, mask_url
from lab.local_broker import LocalBroker

ROOT = Path(__file__).resolve().parent.parent
# AMQP_LAB_RABBITMQ_VERSION -> (official image, locally built image, Debian suite to build it)
VERSIONS = {
    "3.10": ("rabbitmq:3.10-management", "amqp-lab/rabbitmq:bookworm", "bookworm"),
    "4.0": ("rabbitmq:4.0-management", "amqp-lab/rabbitmq:trixie", "trixie"),
    "4.3": ("rabbitmq:4.3-management", "amqp-lab/rabbitmq:sid", "sid"),
}
DEFAULT_VERSION = "4.3"


def wanted_version() -> str:
    """``AMQP_LAB_RABBITMQ_VERSION`` (default :data:`DEFAULT_VERSION`); RuntimeError for a
    version not in :data:`VERSIONS`."""
    version = os.environ.get("AMQP_LAB_RABBITMQ_VERSION", DEFAULT_VERSION)
    if version not in VERSIONS:
        raise RuntimeError(f"AMQP_LAB_RABBITMQ_VERSION={version!r}: choose one of {list(VERSIONS)}")
    return version


@dataclass
class TestBroker:
    """A running broker: ``endpoint()`` gives (host, amqp_port, management_base) now - after a
    container restart the published ports can change."""

    kind: str
    endpoint: Callable[[], tuple[str, int, str]]
    username: str = "guest"
    password: str = "guest"
    restart_fn: Callable[[], None] | None = None
    kill_fn: Callable[[], None] | None = None
    ctl_fn: Callable[..., str] | None = None  # rabbitmqctl on the broker's node
    plugins_fn: Callable[..., str] | None = None  # rabbitmq-plugins on the broker's node
    close_fn: Callable[[], None] = lambda: None
    notes: list[str] = field(default_factory=list)
    version: str = "?"

    __test__ = False  # not a pytest test class

    def settings(self, vhost: str = "/", **overrides: Any) -> BrokerSettings:
        host, port, mgmt = self.endpoint()
        url = (
            f"amqp://{quote(self.username, safe='')}:{quote(self.password, safe='')}@"
            f"{host}:{port}/{quote(vhost, safe='')}"
        )
        return BrokerSettings(amqp_url=url, management_url=mgmt, **overrides)

    def admin(self) -> ManagementClient:
        return ManagementClient(self.settings())

    def at_least(self, major: int, minor: int = 0) -> bool:
        """Whether the broker runs RabbitMQ ``major.minor`` or later (``version``, read from
        the management API's overview by :func:`wait_ready`). RuntimeError while it is unknown:
        a test that branches on the version must not guess."""
        try:
            found = tuple(int(part) for part in self.version.split(".")[:2])
        except ValueError:
            raise RuntimeError(f"broker version unknown ({self.version!r})") from None
        return found >= (major, minor)

    def describe(self) -> str:
        host, port, mgmt = self.endpoint()
        return f"{self.kind} RabbitMQ {self.version} at amqp://{host}:{port} (management {mgmt})"

    def restart(self) -> None:
        assert self.restart_fn is not None
        self.restart_fn()
        wait_ready(self)

    def ctl(self, *args: str) -> str:
        """Run ``rabbitmqctl ARGS`` against the test broker's node; return its output."""
        assert self.ctl_fn is not None
        return self.ctl_fn(*args)

    @contextmanager
    def max_message_size(self, size: int) -> Iterator[None]:
        """Set the broker's ``max_message_size`` to ``size`` bytes for the ``with`` block, then
        restore it. 3.x reads it from the application environment for each new channel; 4.x
        caches it in a persistent_term (checked on 4.0.5), so both are set and restored. Skips
        the test for a broker the tests cannot configure (EAI_AMQP_URL)."""
        if self.ctl_fn is None:
            pytest.skip("the broker came from EAI_AMQP_URL: the tests cannot change its settings")
        env = self.ctl("eval", "application:get_env(rabbit, max_message_size).").strip()
        cached = self.ctl("eval", "persistent_term:get(max_message_size, undefined).").strip()
        self.ctl(
            "eval",
            f"application:set_env(rabbit, max_message_size, {size}), "
            f"persistent_term:put(max_message_size, {size}).",
        )
        try:
            yield
        finally:
            restore = "application:unset_env(rabbit, max_message_size)"
            if env.startswith("{ok,"):
                restore = f"application:set_env(rabbit, max_message_size, {env[4:-1]})"
            restore += ", persistent_term:erase(max_message_size)"
            if cached != "undefined":
                restore += f", persistent_term:put(max_message_size, {cached})"
            self.ctl("eval", restore + ".")

    def plugins_enable(self, *plugins: str) -> bool:
        """``rabbitmq-plugins enable PLUGINS`` on the test broker's node (online: the running
        node starts them); False when this kind of broker offers no way to do it."""
        if self.plugins_fn is None:
            return False
        self.plugins_fn("enable", *plugins)
        return True

    def kill_and_start(self) -> None:
        assert self.kill_fn is not None
        self.kill_fn()
        wait_ready(self)


def wait_ready(broker: TestBroker, timeout: float = 120) -> None:
    """Poll until AMQP accepts TCP and the management API lists a node with mem_limit."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            host, port, mgmt = broker.endpoint()
            socket.create_connection((host, port), timeout=1).close()
            nodes = httpx.get(
                f"{mgmt}/api/nodes", auth=(broker.username, broker.password), timeout=5
            ).json()
            if nodes and nodes[0].get("mem_limit") and nodes[0].get("running", True):
                with broker.admin() as api:
                    broker.version = api.overview().get("rabbitmq_version", "?")
                return
        except Exception as e:
            last = e
        time.sleep(0.5)
    raise RuntimeError(f"broker ({broker.kind}) not ready after {timeout}s: {last}")


def from_env(url: str) -> TestBroker:
    parts = urlsplit(url)
    settings = BrokerSettings(url, os.environ.get("EAI_MGMT_URL") or None)
    mgmt = settings.management_base
    user, password = settings.username, settings.password
    assert parts.hostname
    broker = TestBroker(
        "EAI_AMQP_URL", lambda: (settings.host, settings.port, mgmt), user, password
    )
    broker.notes.append(f"existing broker from EAI_AMQP_URL={mask_url(url)}; restart tests skip")
    return broker


def docker_reachable() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
        return True
    except Exception:
        return False


def _choose_image(notes: list[str]) -> str:
    """The image for the wanted version: AMQP_LAB_RABBITMQ_IMAGE, the official image (present
    or pullable), the locally built one - built now, with scripts/build_test_image.sh, when
    no registry answers and it does not exist yet (a note says so). Raises RuntimeError when
    it cannot be built either."""
    import docker

    if os.environ.get("AMQP_LAB_RABBITMQ_IMAGE"):
        return os.environ["AMQP_LAB_RABBITMQ_IMAGE"]
    official, local, suite = VERSIONS[wanted_version()]
    client = docker.from_env()
    try:
        for image in (official, local):
            try:
                client.images.get(image)
                return image
            except docker.errors.ImageNotFound:
                pass
        try:
            client.images.pull(official)
            return official
        except docker.errors.APIError as e:
            pull_error = e
    finally:
        client.close()
    notes.append(
        f"no RabbitMQ image: {official} cannot be pulled ({type(pull_error).__name__}); "
        f"building {local} from Debian {suite} (scripts/build_test_image.sh, about a minute)"
    )
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_test_image.sh"), suite, local],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if built.returncode != 0:
        raise RuntimeError(
            f"no RabbitMQ image: {official} cannot be pulled and building {local} failed: "
            + (built.stdout + built.stderr).strip()[-500:]
        )
    return local


def require_image(image: str, suite: str, why: str) -> None:
    """Skip (saying ``why``) when no Docker engine is reachable; build ``image`` from Debian
    ``suite`` (scripts/build_test_image.sh) when it does not exist yet."""
    if not docker_reachable():
        pytest.skip(f"no Docker engine reachable: {why}")
    import docker

    client = docker.from_env()
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        script = ROOT / "scripts" / "build_test_image.sh"
        subprocess.run(["bash", str(script), suite, image], check=True, timeout=1800)
    finally:
        client.close()


def from_testcontainers() -> TestBroker:
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from testcontainers.community.rabbitmq import RabbitMqContainer

    notes: list[str] = []
    image = _choose_image(notes)
    container = (
        RabbitMqContainer(image)
        .with_exposed_ports(15672)
        .with_volume_mapping(str(ROOT / "rabbitmq.conf"), "/etc/rabbitmq/rabbitmq.conf", "ro")
        # management + the consistent-hash exchange (the ordered topology's shards)
        .with_volume_mapping(str(ROOT / "enabled_plugins"), "/etc/rabbitmq/enabled_plugins", "ro")
    )
    container.start()

    def endpoint() -> tuple[str, int, str]:
        # Published ports bind every host address; loopback keeps test traffic on this machine.
        amqp = int(container.get_exposed_port(5672))
        mgmt = int(container.get_exposed_port(15672))
        return "127.0.0.1", amqp, f"http://127.0.0.1:{mgmt}"

    wrapped = container.get_wrapped_container()
    broker = TestBroker(
        "testcontainers",
        endpoint,
        restart_fn=lambda: wrapped.restart(timeout=30),
        kill_fn=lambda: _kill_container(wrapped),
        ctl_fn=lambda *args: _exec_ok(container, ["rabbitmqctl", *args]),
        plugins_fn=lambda *args: _exec_ok(container, ["rabbitmq-plugins", *args]),
        close_fn=container.stop,
    )
    broker.notes.extend(notes)
    broker.notes.append(f"testcontainers RabbitMqContainer, image {image}")
    return broker


def _worker_index() -> int:
    """This pytest-xdist worker's number (gw0 -> 0; 0 without xdist): each worker has a test
    broker of its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def from_local_node() -> TestBroker:
    offset = _worker_index()  # one node per xdist worker: its own ports, name and data
    node = LocalBroker(
        nodename=f"amqplabtest{offset or ''}@localhost",
        amqp_port=5692 + offset,
        management_port=15692 + offset,
        dist_port=25692 + offset,
        base_dir=ROOT / ".broker" / f"test-node{offset or ''}",
    )
    node.start()
    broker = TestBroker(
        "dedicated node",
        lambda: ("127.0.0.1", node.amqp_port, node.management_url),
        restart_fn=node.restart,
        kill_fn=lambda: _kill_node(node),
        ctl_fn=lambda *args: _ctl_ok(node, *args),
        close_fn=node.stop,
    )
    broker.notes.append(f"dedicated node {node.nodename} from the OS's rabbitmq-server")
    return broker


def _exec_ok(container: Any, command: list[str]) -> str:
    code, output = container.exec(command)
    text = output.decode() if isinstance(output, bytes) else str(output)
    if code != 0:
        raise RuntimeError(f"{command} exited {code}: {text}")
    return text


def _ctl_ok(node: LocalBroker, *args: str) -> str:
    result = node._ctl(*args)
    if result.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {args} exited {result.returncode}: {result.stderr}")
    return result.stdout


def _kill_container(container: Any) -> None:
    container.kill(signal="SIGKILL")
    container.start()


def _kill_node(node: LocalBroker) -> None:
    node.kill()
    node.start()


def describe_choice() -> str:
    """Which broker a test run will use and why (what :func:`start_test_broker` will do),
    without starting it: printed by scripts/test.sh before anything runs."""
    forced = os.environ.get("AMQP_LAB_TEST_BROKER", "")
    url = os.environ.get("EAI_AMQP_URL")
    if forced == "env" or (not forced and url):
        return f"the broker of EAI_AMQP_URL ({mask_url(url or '?')}); restart tests skip"
    version = wanted_version()
    if forced == "testcontainers" or (not forced and docker_reachable()):
        if os.environ.get("AMQP_LAB_RABBITMQ_IMAGE"):
            return f"testcontainers, image {os.environ['AMQP_LAB_RABBITMQ_IMAGE']}"
        official, local, suite = VERSIONS[version]
        return (
            f"testcontainers, RabbitMQ {version} ({official} if present or pullable, else "
            f"{local}, built from Debian {suite} when missing: about a minute)"
        )
    why = "AMQP_LAB_TEST_BROKER=local" if forced == "local" else "no Docker engine reachable"
    return (
        f"WARNING: {why}: the dedicated local node (the OS's rabbitmq-server), not RabbitMQ "
        f"{version}; the testcontainers path is NOT exercised"
    )


def start_test_broker() -> TestBroker:
    forced = os.environ.get("AMQP_LAB_TEST_BROKER", "")
    url = os.environ.get("EAI_AMQP_URL")
    if forced == "env" or (not forced and url):
        if not url:
            raise RuntimeError("AMQP_LAB_TEST_BROKER=env but EAI_AMQP_URL is unset")
        broker = from_env(url)
    elif forced == "testcontainers":
        broker = from_testcontainers()
    elif not forced and docker_reachable():
        try:
            broker = from_testcontainers()
        except RuntimeError as e:  # no image and none can be built: say so, use the local node
            broker = from_local_node()
            broker.notes.insert(0, f"WARNING: testcontainers NOT used ({e}); local node instead")
    else:
        broker = from_local_node()
        if not forced:
            broker.notes.insert(
                0,
                "WARNING: no Docker engine reachable; testcontainers path "
                "NOT exercised, using the dedicated local node instead",
            )
        if "AMQP_LAB_RABBITMQ_VERSION" in os.environ:
            broker.notes.insert(
                0,
                "WARNING: the dedicated node runs the OS's RabbitMQ, whatever "
                "AMQP_LAB_RABBITMQ_VERSION asks for",
            )
    wait_ready(broker)
    return broker


if __name__ == "__main__":  # python -m tests.brokers: the choice, for scripts/test.sh
    print(f"== test broker: {describe_choice()}", flush=True)
