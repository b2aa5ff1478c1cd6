"""Bad configuration reaches the user as one line naming the problem: no traceback, no password."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from amqp_lab.settings import BrokerSettings
from tests.support import ROOT

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Pa55"


def run_with(
    url: str | None, script: str = "dlq.py", mgmt: str | None = None, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAI_")}
    if url is not None:
        env["EAI_AMQP_URL"] = url
    if mgmt is not None:
        env["EAI_MGMT_URL"] = mgmt
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_clean_line(result: subprocess.CompletedProcess[str], needle: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    assert SECRET not in output
    assert needle in output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_missing_url() -> None:
    assert_one_clean_line(run_with(None), "EAI_AMQP_URL is not set")


@pytest.mark.parametrize(
    "url",
    [
        f"http://u:{SECRET}@host/v",
        f"amqp://u:{SECRET}@:5672/v",
        f"amqp://u:{SECRET}@host:notaport/v",
    ],
)
def test_malformed_url(url: str) -> None:
    assert_one_clean_line(run_with(url), "AMQP URL")


def test_broker_down() -> None:
    url = f"amqp://u:{SECRET}@127.0.0.1:{free_port()}/v"
    assert_one_clean_line(run_with(url), "Connection refused")


def test_publish_to_a_broker_that_is_down_reports_failed() -> None:
    url = f"amqp://u:{SECRET}@127.0.0.1:{free_port()}/v"
    result = run_with(url, "publish.py", None, "--count", "3", "--retries", "2")
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert SECRET not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("message_id=") and " status=failed " in lines[0]
    assert "not confirmed after 2 attempts" in lines[0]
    assert lines[1] == "stopped: 2 message(s) not sent"


def test_wrong_password(vhost: BrokerSettings) -> None:
    url = vhost.amqp_url.replace(f":{vhost.password}@", f":{SECRET}@")
    assert_one_clean_line(run_with(url, "worker.py", vhost.management_url), "authentication failed")


def test_unknown_vhost(vhost: BrokerSettings) -> None:
    url = vhost.with_vhost("no-such-vhost").amqp_url
    assert_one_clean_line(run_with(url, "dlq.py", vhost.management_url), "no-such-vhost")


def test_unreachable_management_api(vhost: BrokerSettings) -> None:
    mgmt = f"http://guest:{SECRET}@127.0.0.1:{free_port()}"
    assert_one_clean_line(
        run_with(vhost.amqp_url, "setup_topology.py", mgmt), "management API unreachable"
    )
