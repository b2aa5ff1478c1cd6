"""A port that is taken is one clear error line, for every command that serves HTTP: the
console, the exporter, a worker's and a publisher's /metrics."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqp_lab.settings import BrokerSettings
from tests.support import one_error_line, run_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("console.py", ("--port", "{port}"), "error: cannot listen on 127.0.0.1:{port}"),
        ("exporter.py", ("--port", "{port}"), "error: cannot serve metrics on 127.0.0.1:{port}"),
        (
            "worker.py",
            ("--metrics-port", "{port}", "--idle-exit", "1"),
            "error: cannot serve metrics on 127.0.0.1:{port}",
        ),
        (
            "publish.py",
            ("--metrics-port", "{port}"),
            "error: cannot serve metrics on port {port}",
        ),
    ],
)
def test_a_taken_port_is_one_error_line(
    topology: BrokerSettings,
    tmp_path: Path,
    taken_port: int,
    script: str,
    args: tuple[str, ...],
    says: str,
) -> None:
    argv = [a.format(port=taken_port) for a in args]
    if script == "worker.py":
        argv += ["--dedup-path", str(tmp_path / "d.sqlite3")]
    result = run_script(topology, script, *argv, timeout=45)
    assert result.returncode == 1, result.stdout + result.stderr
    assert one_error_line(result.stderr).startswith(says.format(port=taken_port))
    assert "on http://" not in result.stdout  # it never claimed to serve
