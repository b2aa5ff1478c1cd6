#!/usr/bin/env python3
"""Durability demo: N persistent + N transient messages, a real broker restart, then count.

Prints ``persistent survived=N/N transient survived=<k>/N``. The broker is restarted by
``--broker local`` (scripts/broker.py's node), ``--broker compose`` (docker compose restart of
compose.yaml's service) or ``--broker auto`` (local if EAI_AMQP_URL points at it, else compose
if its service is running). With only a URL and no way to restart, it says so and exits 4.
"""

from __future__ import annotations

import shutil
import subprocess

from _cli import EXIT_CANNOT_RESTART, EXIT_OK, ROOT, run, settings_from_env

from amqp_lab.cli.parser import CommandParser
from amqp_lab.settings import BrokerSettings
from lab.durability import run_restart_demo
from lab.local_broker import LocalBroker, LocalBrokerError


def compose_running() -> bool:
    if shutil.which("docker") is None:
        return False
    result = subprocess.run(
        ["docker", "compose", "ps", "-q", "rabbitmq"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0 and bool(result.stdout.strip())


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--broker", choices=["auto", "local", "compose"], default="auto")
    args = parser.parse_args()
    settings = settings_from_env("amqp-lab restart_demo")
    local = LocalBroker()
    how = args.broker
    if how == "auto":
        if (
            settings.port == local.amqp_port
            and settings.host in ("127.0.0.1", "localhost")
            and local.is_running()
        ):
            how = "local"
        elif compose_running():
            how = "compose"
        else:
            print(
                f"cannot restart the broker at {settings.masked_url}: it is neither "
                "scripts/broker.py's node nor the compose service; only a URL was given"
            )
            return EXIT_CANNOT_RESTART

    def restart() -> BrokerSettings:
        print(f"restarting the broker ({how}) ...", flush=True)
        if how == "local":
            local.restart()
        else:
            done = subprocess.run(
                ["docker", "compose", "restart", "rabbitmq"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise LocalBrokerError(f"docker compose restart failed: {done.stderr.strip()}")
        return settings

    result = run_restart_demo(settings, restart, args.count)
    print(result.line())
    return EXIT_OK


if __name__ == "__main__":
    run(main)
