"""How our PostgreSQL connections notice a network that is gone (pure: no I/O).

A connection whose peer vanished - the network cut, a host powered off, a failover that moved
the server's address - gets no FIN and no RST. Without more, libpq waits as long as the
kernel does:

* for an answer to a request the server received: for ever, since the socket is idle and
  Linux sends no keepalive probe before two hours (``tcp_keepalive_time``);
* for a request not yet acknowledged: until TCP gives up retransmitting, about 15 minutes
  (``tcp_retries2``).

Measured here with the server's port dropped by iptables: a ``SELECT`` still hung after 20 s
either way. Reported: psycopg/psycopg2#561 (a query hangs for ever on a lost network),
psycopg/psycopg2#1017 (an 8-minute hang in ``execute`` at an RDS failover, in spite of
``statement_timeout``). A relay would stop publishing and a worker stop settling its
deliveries, with nothing in the logs.

Every connection the library opens to PostgreSQL - a worker's dedup store, a relay's outbox
and its ``LISTEN``, the health check, ``amqp-lab-relay status`` - therefore sets libpq's TCP
keepalives and ``tcp_user_timeout``
(https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-KEEPALIVES), so a dead link
fails the call with an OperationalError - an outage the caller already handles
(StoreUnavailable, OutboxUnavailable) - within about :attr:`PgKeepalive.dead_after` seconds.
A live server answers the probes from its kernel even while a statement runs for a long time,
so a slow query or a lock wait is never cut by them. A parameter the URL sets itself
(``?keepalives_idle=60``) wins. Connections the application passes in (``amqp_lab.outbox.add``
in its own transaction) are its own to configure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from psycopg.conninfo import conninfo_to_dict

__all__ = ["DEFAULT_KEEPALIVE", "MAX_USER_TIMEOUT", "PgKeepalive"]

MAX_USER_TIMEOUT = 2_147_483.647
"""The largest ``tcp_user_timeout`` the kernel takes: INT_MAX milliseconds, in seconds."""


@dataclass(frozen=True)
class PgKeepalive:
    """libpq's keepalive parameters for one of our connections.

    * ``idle`` (s): silence on the connection before the first keepalive probe;
    * ``interval`` (s): between probes; ``count``: unanswered probes before the connection is
      dropped - so a link that dies while we wait for an answer is found after about
      ``idle + interval * count`` seconds;
    * ``user_timeout`` (s): how long data we sent may stay unacknowledged before the connection
      is dropped (``TCP_USER_TIMEOUT``; Linux also ends a connection whose probes went
      unanswered this long).

    Raises ValueError for a count, idle or interval below 1 or not whole, or a user_timeout
    that is not finite, not above 0 or above :data:`MAX_USER_TIMEOUT`."""

    idle: int = 10
    interval: int = 5
    count: int = 3
    user_timeout: float = 30.0

    def __post_init__(self) -> None:
        for name in ("idle", "interval", "count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"keepalive {name} must be a whole number >= 1, got {value!r}")
        timeout = self.user_timeout
        if not (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and 0 < timeout <= MAX_USER_TIMEOUT
        ):
            raise ValueError(
                f"keepalive user_timeout must be > 0 and <= {MAX_USER_TIMEOUT:,.3f} seconds,"
                f" got {timeout!r}"
            )

    @property
    def dead_after(self) -> float:
        """Seconds, about, before a dead link fails a call: the later of the probes' end and
        ``user_timeout`` when data is in flight - at most the larger of the two."""
        return max(float(self.idle + self.interval * self.count), self.user_timeout)

    def params(self, conninfo: str) -> dict[str, Any]:
        """The libpq keyword arguments for ``psycopg.connect(conninfo, **params)``: keepalives
        on, with these settings, but for any parameter ``conninfo`` (a URL or ``key=value``
        string) sets itself: ``keepalives=0`` in the URL turns the probes off but keeps
        ``tcp_user_timeout`` (a request unacknowledged that long still fails the call; add
        ``tcp_user_timeout=0`` for the kernel's own). A libpq service file's settings are
        overridden by these keywords: give them in the URL. Raises psycopg.ProgrammingError
        for a conninfo libpq cannot parse (the callers check their URL first)."""
        ours: dict[str, Any] = {
            "keepalives": 1,
            "keepalives_idle": self.idle,
            "keepalives_interval": self.interval,
            "keepalives_count": self.count,
            "tcp_user_timeout": max(1, round(self.user_timeout * 1000)),
        }
        given = conninfo_to_dict(conninfo)
        return {name: value for name, value in ours.items() if name not in given}


DEFAULT_KEEPALIVE = PgKeepalive()
"""A dead link found within about 30 s: probes after 10 s of silence, 3 of them 5 s apart,
and 30 s for data to be acknowledged."""
