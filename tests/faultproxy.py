"""A fault-injecting TCP proxy for the tests: client <-> proxy <-> broker (or database).

Faults, each applied to every connection through the proxy:

* ``cut()`` - reset every connection at once (RST, as when a broker or a NAT drops it);
* ``stall(seconds)`` - forward nothing either way while the sockets stay open: a frozen
  network or a paused broker; heartbeats stop and both sides notice only by timeout;
* ``half_open()`` - close the broker side silently and keep the client side open without a
  FIN: the client keeps writing into the void (a host that died, a firewall that dropped the
  state) until its heartbeat gives up;
* ``slow(delay)`` - forward every chunk ``delay`` seconds late (a congested link).

``refuse()`` makes new connections fail until ``accept()``. Pure standard library, threads.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from types import TracebackType


class FaultProxy:
    """Listens on 127.0.0.1:``port`` (0: a free port) and forwards to ``target``."""

    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._delay = 0.0
        self._refusing = False
        self._closed = False
        self.connections = 0  # accepted so far
        threading.Thread(target=self._accept, name="faultproxy-accept", daemon=True).start()

    # --- faults ---------------------------------------------------------------------------------
    def cut(self) -> None:
        """Reset every open connection (SO_LINGER 0: the peers see ECONNRESET)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _reset(sock)

    def stall(self, seconds: float) -> None:
        """Forward nothing for ``seconds`` (blocks the caller that long)."""
        self._flowing.clear()
        try:
            time.sleep(seconds)
        finally:
            self._flowing.set()

    def half_open(self) -> None:
        """Close the upstream sockets; the client sockets stay open and silent."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, upstream in pairs:
            _reset(upstream)
            _HALF_OPEN.append(client)  # kept open (and referenced) until the proxy closes

    def slow(self, delay: float) -> None:
        """Forward each chunk ``delay`` seconds late (0: back to normal)."""
        self._delay = delay

    def refuse(self) -> None:
        """Refuse new connections (accepted, then reset at once)."""
        self._refusing = True

    def accept(self) -> None:
        self._refusing = False

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    # --- plumbing -------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._pairs.append((client, upstream))
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                if self._delay:
                    time.sleep(self._delay)
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                alive = any(src in pair for pair in self._pairs)
                self._pairs = [p for p in self._pairs if src not in p]
            if alive:  # the other side closed normally: pass the close on
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self._flowing.set()
        self.cut()
        while _HALF_OPEN:
            _reset(_HALF_OPEN.pop())

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_HALF_OPEN: list[socket.socket] = []


def _reset(sock: socket.socket) -> None:
    """Abort ``sock`` with a RST. close() alone does not release a socket that another thread
    is blocked reading (Linux), so nothing would reach the peer until that read returns;
    shutdown(SHUT_RD) wakes the reader first without sending a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()
