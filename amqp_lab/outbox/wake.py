"""What wakes a relay: PostgreSQL's LISTEN/NOTIFY, the one relay's lock file on SQLite.

:func:`amqp_lab.outbox.add` sends ``NOTIFY amqp_lab_outbox`` in the writer's transaction;
PostgreSQL delivers it at commit, and only then (a rolled-back transaction notifies nobody:
https://www.postgresql.org/docs/current/sql-notify.html). :class:`NotifyListener` holds a
connection of its own that LISTENs and sets the relay's wake event on each notification. A
notification can be missed - the listener's connection lost, the server restarted - so the
relay also polls, and the listener wakes the relay each time it connects again.

On SQLite one relay at a time may relay a database file: :class:`RelayLock` is an exclusive
``flock`` on ``<file>.relay-lock``, released by the kernel when its process dies, however it
dies. The next relay to take it knows the last holder is gone and releases its leases at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg

from amqp_lab.dedup.keepalive import DEFAULT_KEEPALIVE, PgKeepalive
from amqp_lab.errors import OutboxError
from amqp_lab.outbox.schema import NOTIFY_CHANNEL
from amqp_lab.retry.policy import full_jitter
from amqp_lab.settings import mask_url

__all__ = ["NotifyListener", "RelayLock"]

log = logging.getLogger(__name__)
relay_log = logging.getLogger("amqp_lab.outbox.relay")  # the relay's own lines


class NotifyListener:
    """LISTEN on ``channel`` in the PostgreSQL database ``url`` and call ``wake()`` for each
    notification (and after each reconnect), on a daemon thread, until :meth:`stop`. A lost
    connection is retried with capped full-jitter backoff (``base`` / ``cap`` seconds),
    forever: meanwhile the relay polls. ``connected`` tells whether it listens now. The
    connection is idle between notifications, so only ``keepalive``'s probes find out that its
    network is gone (:mod:`amqp_lab.dedup.keepalive`); it is then lost and retried as any
    other."""

    def __init__(
        self,
        url: str,
        wake: Callable[[], None],
        channel: str = NOTIFY_CHANNEL,
        base: float = 0.2,
        cap: float = 5.0,
        on_state: Callable[[str], None] | None = None,
        keepalive: PgKeepalive = DEFAULT_KEEPALIVE,
    ) -> None:
        self.url, self.wake, self.channel = url, wake, channel
        self.base, self.cap = base, cap
        self._keepalive = keepalive.params(url)
        self.on_state = on_state or (lambda text: log.warning("%s", text))
        self.connected = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="amqp-lab-outbox-listen", daemon=True
        )

    def start(self) -> NotifyListener:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (within about a second)."""
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=10,
                    application_name="amqp-lab relay listen",
                    **self._keepalive,
                ) as connection:
                    connection.execute(f'LISTEN "{self.channel}"')
                    if failures:
                        self.on_state(f"LISTEN {self.channel}: connected again")
                    failures, self.connected = 0, True
                    self.wake()  # whatever was committed meanwhile
                    while not self._stop.is_set():
                        for _ in connection.notifies(timeout=1.0):
                            self.wake()
            except psycopg.Error as e:
                self.connected = False
                failures += 1
                if failures == 1:
                    text = mask_url(" ".join(str(e).split()))
                    self.on_state(f"LISTEN {self.channel} lost ({text}); polling meanwhile")
                self._stop.wait(full_jitter(min(failures, 10), self.base, self.cap))
        self.connected = False


class RelayLock:
    """The one-relay lock of a SQLite outbox: an exclusive ``flock`` on ``path``, which holds
    the holder's host and pid for people. :meth:`try_acquire` never waits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; whether this object holds it now. Raises OSError when
        the file cannot be opened."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        self._fd = fd
        return True

    def take(self, reset: Callable[[], int]) -> bool:
        """Hold the lock: True at once when held; else take it if it is free and call
        ``reset`` (release the leases the last holder left; their count is logged); False
        while another relay holds it. Raises OutboxError when the lock file cannot be opened,
        and ``reset``'s errors with the lock released again."""
        if self.held:
            return True
        try:
            if not self.try_acquire():
                return False
        except OSError as e:
            raise OutboxError(f"cannot open the relay lock {self.path}: {e}") from e
        try:
            released = reset()
        except BaseException:
            self.release()
            raise
        relay_log.info("relay lock %s taken; %d stale lease(s) released", self.path, released)
        return True

    def holder(self) -> str:
        """Who holds (or last held) the lock: ``host pid``, or '' when unknown."""
        try:
            return self.path.read_text(errors="replace").strip()
        except OSError:
            return ""

    def release(self) -> None:
        """Release the lock (closing the file releases the flock)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
