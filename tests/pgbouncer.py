"""A PgBouncer of a test's own in front of a :class:`lab.pg_node.PgNode`: Debian's ``pgbouncer``
binary, on a free port of 127.0.0.1, ``trust`` authentication, one pool of ``pool_size``
server connections in ``mode`` (``transaction`` by default: the mode that hands one server
session to many clients). PgBouncer refuses to run as root, so when we are root its directory
is handed to the ``postgres`` user and it runs as that user (as the node does)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

from lab.pg_node import PgNode, free_port

__all__ = ["PgBouncer", "unavailable"]


def unavailable() -> str | None:
    """Why a PgBouncer cannot run here (no binary), or None."""
    return None if shutil.which("pgbouncer") else "no pgbouncer binary (apt-get install pgbouncer)"


class PgBouncer:
    """PgBouncer for ``database`` of ``node``; a context manager (started on enter, stopped and
    its directory removed on exit). :attr:`url` connects through it. ``ignore_options``: list
    ``options`` in ``ignore_startup_parameters`` - accepted from clients, then dropped."""

    def __init__(
        self,
        node: PgNode,
        database: str,
        mode: str = "transaction",
        pool_size: int = 1,
        ignore_options: bool = False,
        settings: str = "",
    ) -> None:
        self.node, self.database, self.mode, self.pool_size = node, database, mode, pool_size
        self.ignore_options = ignore_options
        self.settings = settings  # more lines for its [pgbouncer] section
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="amqp-lab-pgbouncer-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """A URL to ``database`` through the pooler (user postgres, no password)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def _write_config(self) -> Path:
        ini = self.base / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"{self.database} = host=127.0.0.1 port={self.node.port} dbname={self.database}"
            " user=postgres\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "auth_type = trust\n"
            f"auth_file = {self.base / 'users.txt'}\n"
            f"pool_mode = {self.mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "unix_socket_dir =\n"
            f"logfile = {self.base / 'pgbouncer.log'}\n"
            + ("ignore_startup_parameters = options\n" if self.ignore_options else "")
            + self.settings
        )
        (self.base / "users.txt").write_text('"postgres" ""\n')
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            for path in (self.base, ini, self.base / "users.txt"):
                os.chown(path, user.pw_uid, user.pw_gid)
        return ini

    def start(self, timeout: float = 20) -> None:
        """Start it and wait until a client gets through to the node."""
        ini = self._write_config()
        argv = ["pgbouncer", str(ini)]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2) as probe:
                    probe.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log = self.base / "pgbouncer.log"
                    text = log.read_text()[-2000:] if log.exists() else ""
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start: {text}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the pooler (SIGTERM, then SIGKILL after 10 s); its clients' connections close."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            if process.stderr is not None:
                process.stderr.close()

    def __enter__(self) -> PgBouncer:
        try:
            self.start()
        except BaseException:
            shutil.rmtree(self.base, ignore_errors=True)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
