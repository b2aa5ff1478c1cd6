"""amqps:// with certificate verification, against a broker whose CA is generated here."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from amqp_lab.settings import BrokerSettings
from tests.brokers import ROOT, TestBroker, _choose_image, docker_reachable, wait_ready
from tests.support import parse_lines, run_script

pytestmark = pytest.mark.integration


def make_certificates(directory: Path) -> None:
    """A CA and a server certificate for 127.0.0.1 / localhost, with openssl."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=amqp-lab test CA",
        "-keyout",
        "ca_key.pem",
        "-out",
        "ca.pem",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server_key.pem",
        "-out",
        "server.csr",
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca_key.pem",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    )
    for name in ("ca.pem", "server.pem", "server_key.pem"):
        os.chmod(directory / name, 0o644)  # the broker runs as another user in the container
    (directory / "20-tls.conf").write_text(
        "listeners.ssl.default = 5671\n"
        "ssl_options.cacertfile = /certs/ca.pem\n"
        "ssl_options.certfile = /certs/server.pem\n"
        "ssl_options.keyfile = /certs/server_key.pem\n"
        "ssl_options.verify = verify_none\n"
        "ssl_options.fail_if_no_peer_cert = false\n"
    )


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(amqps base URL, management URL, CA file) of a TLS-enabled test broker."""
    if not docker_reachable():
        pytest.skip("the TLS broker is a testcontainers container: no Docker engine here")
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from testcontainers.community.rabbitmq import RabbitMqContainer

    certs = tmp_path_factory.mktemp("certs")
    certs.chmod(0o755)
    make_certificates(certs)
    notes: list[str] = []
    container = (
        RabbitMqContainer(_choose_image(notes))
        .with_exposed_ports(15672, 5671)
        .with_volume_mapping(str(ROOT / "rabbitmq.conf"), "/etc/rabbitmq/rabbitmq.conf", "ro")
        .with_volume_mapping(str(certs / "20-tls.conf"), "/etc/rabbitmq/conf.d/20-tls.conf", "ro")
        .with_volume_mapping(str(certs), "/certs", "ro")
    )
    container.start()
    try:

        def endpoint() -> tuple[str, int, str]:
            mgmt = container.get_exposed_port(15672)
            return "127.0.0.1", int(container.get_exposed_port(5672)), f"http://127.0.0.1:{mgmt}"

        wait_ready(TestBroker("tls", endpoint))
        tls_port = int(container.get_exposed_port(5671))
        yield (f"amqps://guest:guest@127.0.0.1:{tls_port}/%2F", endpoint()[2], certs / "ca.pem")
    finally:
        container.stop()


def test_amqps_with_our_ca_publishes_and_consumes(tls_broker: tuple[str, str, Path]) -> None:
    base, mgmt, ca = tls_broker
    url = f"{base}?cacertfile={quote(str(ca), safe='')}"
    settings = BrokerSettings(url, mgmt)
    assert run_script(settings, "setup_topology.py").returncode == 0
    published = run_script(settings, "publish.py", "--count", "2")
    assert published.returncode == 0, published.stderr
    assert [r["status"] for r in parse_lines(published.stdout)] == ["confirmed"] * 2
    worker = run_script(settings, "worker.py", "--idle-exit", "1")
    assert [r["outcome"] for r in parse_lines(worker.stdout)] == ["processed"] * 2


def test_amqps_refuses_a_certificate_it_cannot_verify(tls_broker: tuple[str, str, Path]) -> None:
    base, mgmt, _ = tls_broker
    result = run_script(BrokerSettings(base, mgmt), "dlq.py")  # system trust store only
    assert result.returncode == 1
    assert (
        "CERTIFICATE_VERIFY_FAILED" in result.stderr or "certificate verify failed" in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_amqps_with_a_missing_ca_file_is_a_clear_error(tls_broker: tuple[str, str, Path]) -> None:
    base, mgmt, _ = tls_broker
    result = run_script(BrokerSettings(f"{base}?cacertfile=%2Fno%2Fsuch.pem", mgmt), "dlq.py")
    assert result.returncode == 1
    assert "TLS or URL settings" in result.stderr and "No such file" in result.stderr
