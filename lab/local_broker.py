"""A dedicated local RabbitMQ node run from the OS's ``rabbitmq-server``.

Its own node name, data and log dirs under a git-ignored folder, our ``rabbitmq.conf`` plus an
overlay that moves every port clear of a broker already on this machine (AMQP 5672, Erlang
distribution 25672, management 15672; epmd's 4369 is shared). Debian's scripts run the node as
the ``rabbitmq`` user, so the data and log dirs are chowned to it when we run as root.
https://www.rabbitmq.com/docs/configure#customise-environment
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from amqp_lab.errors import AmqpLabError

# management, and the consistent-hash exchange the ordered topology routes through
ENABLED_PLUGINS = "[rabbitmq_management,rabbitmq_consistent_hash_exchange].\n"

ROOT = Path(__file__).resolve().parent.parent


class LocalBrokerError(AmqpLabError):
    """The dedicated node could not be started, stopped or found."""


@dataclass(frozen=True)
class LocalBroker:
    """Ports: ``amqp_port`` (AMQP), ``management_port`` (HTTP API), ``dist_port`` (Erlang
    distribution, used by rabbitmqctl). ``base_dir`` holds data/, log/, conf.d/, pid."""

    nodename: str = "amqplab@localhost"
    amqp_port: int = 5682
    management_port: int = 15682
    dist_port: int = 25682
    base_dir: Path = ROOT / ".broker"
    config_file: Path = ROOT / "rabbitmq.conf"

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def pid_file(self) -> Path:
        return self.base_dir / "rabbitmq.pid"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.base_dir / "data"),
            RABBITMQ_LOG_BASE=str(self.base_dir / "log"),
            RABBITMQ_CONFIG_FILE=str(self.config_file),
            RABBITMQ_CONFIG_FILES=str(self.base_dir / "conf.d"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base_dir / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.pid_file),
        )
        return env

    def _prepare(self) -> None:
        if shutil.which("rabbitmq-server") is None:
            raise LocalBrokerError(
                "rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)"
            )
        for sub in ("data", "log", "conf.d"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.base_dir / "conf.d" / "90-ports.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            f"management.tcp.port = {self.management_port}\n"
            "management.tcp.ip = 127.0.0.1\n"
        )
        (self.base_dir / "enabled_plugins").write_text(ENABLED_PLUGINS)
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("rabbitmq")
            except KeyError:
                return
            for path in [self.base_dir, *self.base_dir.rglob("*")]:
                os.chown(path, user.pw_uid, user.pw_gid)

    def _ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        if shutil.which("rabbitmqctl") is None:
            raise LocalBrokerError(
                "rabbitmqctl is not installed (Debian: apt-get install rabbitmq-server)"
            )
        return subprocess.run(
            ["rabbitmqctl", "-n", self.nodename, *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def is_running(self) -> bool:
        """True when the node answers rabbitmqctl and its AMQP port accepts connections."""
        return self._ctl("ping", timeout=30).returncode == 0 and _port_open(self.amqp_port)

    def start(self, timeout: float = 90) -> None:
        """Start the node detached and wait (up to ``timeout`` seconds) until AMQP and the
        management API accept connections. A running node is left as it is."""
        if self.is_running():
            return
        for port in (self.amqp_port, self.management_port, self.dist_port):
            if _port_open(port):
                raise LocalBrokerError(f"port {port} is already taken by another process")
        self._prepare()
        subprocess.run(
            ["rabbitmq-server", "-detached"],
            env=self._env(),
            check=False,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _port_open(self.amqp_port) and _port_open(self.management_port):
                return
            time.sleep(0.5)
        raise LocalBrokerError(
            f"node {self.nodename} did not start within {timeout:.0f}s; see {self.base_dir / 'log'}"
        )

    def stop(self, timeout: float = 90) -> None:
        """Stop the node cleanly (rabbitmqctl shutdown waits for the OS process to exit)."""
        if self._ctl("ping", timeout=30).returncode != 0:
            return
        result = self._ctl("shutdown", timeout=timeout)
        if result.returncode != 0:
            raise LocalBrokerError(f"shutdown failed: {result.stderr.strip()[-300:]}")
        _wait_port_closed(self.amqp_port, timeout)

    def kill(self) -> None:
        """SIGKILL the node's Erlang VM (a crash, not a clean stop)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError) as e:
            raise LocalBrokerError(f"no pid file at {self.pid_file}") from e
        os.kill(pid, signal.SIGKILL)
        _wait_port_closed(self.amqp_port, 30)

    def restart(self) -> None:
        """A real process restart that keeps the data dir (durable queues, persistent messages).
        Raises LocalBrokerError, touching nothing, when the running node keeps its data in
        another checkout's ``.broker``: restarting it from here would bring it back empty (the
        node name and ports are per machine, the data dir per checkout)."""
        running_in = self.running_data_dir()
        ours = self.base_dir / "data"
        if running_in is not None and not running_in.is_relative_to(ours):
            raise LocalBrokerError(
                f"node {self.nodename} runs on the data of another checkout ({running_in}); "
                f"restarting it from here would start it with the empty {ours}: run this from "
                "that checkout, or stop the node there first (python scripts/broker.py stop)"
            )
        self.stop()
        self.start()

    def running_data_dir(self) -> Path | None:
        """The running node's own data dir (``rabbit_mnesia:dir()``), None when it does not
        answer."""
        result = self._ctl("eval", "rabbit_mnesia:dir().", timeout=30)
        text = result.stdout.strip().strip('"')
        return Path(text) if result.returncode == 0 and text.startswith("/") else None

    def status(self) -> str:
        return "running" if self.is_running() else "stopped"


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_port_closed(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _port_open(port) and time.monotonic() < deadline:
        time.sleep(0.2)
