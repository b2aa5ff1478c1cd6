"""A PostgreSQL server of a run's own, to restart at will: the shared server on 5432 is never
touched.

Debian's server binaries (``/usr/lib/postgresql/<version>/bin``: initdb, pg_ctl) make a
cluster in a fresh directory, listening on 127.0.0.1 at a free port, with ``trust``
authentication for local connections and ``track_commit_timestamp = on`` (the outbox chaos run
reads each business row's commit time to know the true commit order). PostgreSQL refuses to
run as root, so when we are root the directory is handed to the ``postgres`` user and every
command runs as that user (``runuser``). :meth:`PgNode.restart` stops the server in
``immediate`` mode - no checkpoint, sessions cut, as a crash - and starts it again.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

__all__ = ["PgNode", "PgNodeError", "find_bin_dir", "free_port"]


class PgNodeError(RuntimeError):
    """The server could not be made, started or stopped; the message says why."""


def find_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with initdb and pg_ctl. PgNodeError
    when there is none."""
    found = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "pg_ctl").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not found:
        raise PgNodeError("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")
    return found[-1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgNode:
    """A throwaway cluster in ``base`` (default: a new temporary directory) on ``port``
    (default: a free one). Use as a context manager: started on enter, stopped and removed on
    exit."""

    def __init__(self, base: Path | None = None, port: int | None = None) -> None:
        self.bin = find_bin_dir()
        self.base = base or Path(tempfile.mkdtemp(prefix="amqp-lab-pg-"))
        self.data = self.base / "data"
        self.port = port or free_port()
        self._as_postgres = os.geteuid() == 0

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _command(self, *argv: str, timeout: float = 120) -> str:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise PgNodeError(f"{argv[0]} failed: {(done.stderr or done.stdout).strip()[-500:]}")
        return done.stdout

    def init(self) -> None:
        """initdb with trust auth and the settings the runs need."""
        self.base.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self._command(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        settings = (
            f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{self.base}'\ntrack_commit_timestamp = on\n"
            "max_connections = 200\nfsync = on\nsynchronous_commit = on\n"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(settings)

    def start(self, timeout: float = 60) -> None:
        """pg_ctl start, then wait until it accepts connections."""
        self._command("pg_ctl", "-D", str(self.data), "-l", str(self.base / "log"), "-w", "start")
        self.wait_ready(timeout)

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop -m ``mode`` (fast, immediate)."""
        self._command("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_for: float = 0.0) -> float:
        """Crash-like restart: stop immediate, stay down ``down_for`` seconds, start; the
        seconds it took."""
        started = time.monotonic()
        self.stop("immediate")
        time.sleep(down_for)
        self.start()
        return time.monotonic() - started

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.admin_url, connect_timeout=2):
                    return
            except psycopg.Error as e:
                if time.monotonic() > deadline:
                    raise PgNodeError(f"PostgreSQL on port {self.port} not ready: {e}") from e
                time.sleep(0.2)

    def create_database(self, name: str) -> str:
        """CREATE DATABASE ``name``; its URL."""
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def remove(self) -> None:
        """Stop the server (immediate) if it runs, and delete its directory."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(PgNodeError):
                self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PgNode:
        try:
            self.init()
            self.start()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
