"""Opening AMQP connections and translating pika's errors at the boundary.

Every pika exception that leaves amqp-lab's I/O code goes through :func:`translate` so callers
see only :mod:`amqp_lab.errors`.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pika
import pika.exceptions as pe

import amqp_lab.wire  # noqa: F401  - every content header of the process decodes losslessly
from amqp_lab.errors import (
    AccessRefused,
    AmqpLabError,
    AuthenticationFailed,
    BrokerBlocked,
    BrokerUnavailable,
    ChannelError,
    ConfigurationError,
    ConnectionLost,
    NotFound,
    PreconditionFailed,
    VhostAccessDenied,
)
from amqp_lab.settings import BrokerSettings, mask_secrets

__all__ = [
    "TLS_QUERY_KEYS",
    "BlockedTime",
    "address_order",
    "channel_error",
    "close_quietly",
    "connect",
    "connection_parameters",
    "drop_connection",
    "open_channel",
    "translate",
]

log = logging.getLogger(__name__)

TLS_QUERY_KEYS = ("cacertfile", "certfile", "keyfile", "server_name_indication", "verify")


def connection_parameters(settings: BrokerSettings) -> pika.URLParameters:
    """pika parameters for ``settings`` (its first URL: see :meth:`BrokerSettings.addresses`
    for the others): heartbeat and blocked_connection_timeout in seconds,
    one connection attempt (retries belong to tenacity in the caller).

    amqps:// verifies the server certificate and host name, against the system trust store or
    the ``cacertfile`` named in the URL's query; ``certfile`` / ``keyfile`` give a client
    certificate, ``server_name_indication`` the name to check, ``verify=verify_none`` turns
    verification off (https://www.rabbitmq.com/docs/uri-query-parameters).
    """
    parts = urlsplit(settings.amqp_url)
    query = parse_qs(parts.query)
    tls = {key: query.pop(key)[0] for key in TLS_QUERY_KEYS if key in query}
    url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query, doseq=True), ""))
    params = pika.URLParameters(url)
    params.heartbeat = settings.heartbeat
    params.blocked_connection_timeout = settings.blocked_connection_timeout
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.stack_timeout = 15
    params.client_properties = {"connection_name": settings.connection_name}
    if settings.scheme == "amqps":
        context = ssl.create_default_context(cafile=tls.get("cacertfile"))
        if "certfile" in tls:
            context.load_cert_chain(tls["certfile"], tls.get("keyfile"))
        if tls.get("verify") == "verify_none":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        params.ssl_options = pika.SSLOptions(
            context, tls.get("server_name_indication", settings.host)
        )
    return params


def address_order(count: int, start: int | None = None) -> list[int]:
    """The order in which the nodes of an address list are tried (pure): each once, from
    ``start`` (random when None) and then in turn, so clients spread over a cluster's nodes
    and a dead node is only one failed attempt
    (https://www.rabbitmq.com/docs/clustering#clients)."""
    first = random.randrange(count) if start is None else start % count
    return [(first + i) % count for i in range(count)]


def connect(settings: BrokerSettings) -> pika.BlockingConnection:
    """Open a blocking AMQP connection (connection.start/tune/open on the URL's vhost). With
    several URLs (a cluster's nodes), each is tried once, one connection attempt per node, in
    :func:`address_order`, and the first that opens is returned. (Not pika's own list
    handling: a host name that does not resolve ends pika's whole attempt, and pika reports
    only the last node's error.)

    Raises AuthenticationFailed (bad credentials: credentials are the cluster's, so the other
    nodes are not tried), VhostAccessDenied (unknown vhost or no permission, on every node that
    answered), BrokerUnavailable (no node could be reached: nothing listening, DNS, TLS; the
    message names each node's error). A connection that never opened is never ConnectionLost.
    """
    addresses = settings.addresses()
    try:
        params = [(a, connection_parameters(a)) for a in addresses]
    except (OSError, ValueError) as e:  # an unreadable CA / key file, a bad query value
        raise ConfigurationError(f"TLS or URL settings of {settings.masked_url}: {e}") from e
    failures: list[tuple[AmqpLabError, BaseException]] = []
    for index in address_order(len(params)):
        address, parameters = params[index]
        try:
            return pika.BlockingConnection(parameters)
        except Exception as e:
            error = translate(e, address)
            if isinstance(error, AuthenticationFailed):
                raise error from e
            if isinstance(error, ConnectionLost):  # e.g. a socket.gaierror: it never opened
                error = BrokerUnavailable(str(error).replace("connection failed", "cannot connect"))
            failures.append((error, e))
    refused = [(error, e) for error, e in failures if isinstance(error, VhostAccessDenied)]
    if refused:
        raise refused[0][0] from refused[0][1]
    if len(failures) == 1:
        raise failures[0][0] from failures[0][1]
    raise BrokerUnavailable(
        f"no node of {settings.masked_url} answered: "
        + "; ".join(str(error) for error, _ in failures)
    ) from failures[-1][1]


def translate(error: BaseException, settings: BrokerSettings | None = None) -> AmqpLabError:
    """Map a pika exception to the amqp-lab error it means. Messages are masked."""
    if isinstance(error, AmqpLabError):
        return error
    where = f" at {settings.masked_url}" if settings is not None else ""
    secrets = (settings.password,) if settings is not None else ()

    def msg(text: str) -> str:
        return mask_secrets(text, *secrets)

    if isinstance(error, pe.ConnectionBlockedTimeout):
        return BrokerBlocked(msg(f"broker kept the connection blocked (resource alarm){where}"))
    if isinstance(error, pe.ProbableAuthenticationError | pe.AuthenticationError):
        return AuthenticationFailed(msg(f"authentication failed{where}: wrong username/password"))
    if isinstance(error, pe.ProbableAccessDeniedError):
        vhost = settings.vhost if settings else "?"
        return VhostAccessDenied(
            msg(
                f"access to vhost {vhost!r} refused{where}: it does not exist or the user "
                "has no permissions on it"
            )
        )
    if isinstance(error, pe.ConnectionClosedByBroker):
        if error.reply_code == 530:
            return VhostAccessDenied(msg(f"vhost access refused{where}: {error.reply_text}"))
        if error.reply_code == 403:
            return AuthenticationFailed(msg(f"access refused{where}: {error.reply_text}"))
        return ConnectionLost(
            msg(f"broker closed the connection{where}: {error.reply_code} {error.reply_text}")
        )
    if isinstance(error, pe.ChannelClosedByBroker):
        return channel_error(error.reply_code, error.reply_text)
    if isinstance(error, pe.AMQPConnectionError):
        if isinstance(error, pe.StreamLostError | pe.ConnectionWrongStateError):
            return ConnectionLost(msg(f"connection lost{where}: {error}"))
        if isinstance(error, pe.IncompatibleProtocolError):
            return BrokerUnavailable(msg(f"no AMQP 0-9-1 broker answered{where}"))
        detail = str(error) or type(error).__name__
        if isinstance(error, pe.AMQPConnectionError) and error.args:
            # pika's workflow errors have an empty str(); their repr names the cause
            detail = "; ".join(str(a) or repr(a) for a in error.args)
        return BrokerUnavailable(msg(f"cannot connect{where}: {detail}"))
    if isinstance(error, pe.ChannelWrongStateError | pe.ChannelClosed):
        return ConnectionLost(msg(f"channel closed{where}: {error}"))
    if isinstance(error, pe.AMQPError | OSError):
        return ConnectionLost(msg(f"connection failed{where}: {type(error).__name__}: {error}"))
    return AmqpLabError(msg(f"{type(error).__name__}: {error}"))


def channel_error(reply_code: int, reply_text: str) -> ChannelError:
    """The ChannelError subclass for a channel.close reply code (404, 403, 406, other)."""
    text = f"{reply_code} {reply_text}"
    if reply_code == 404:
        return NotFound(text, reply_code)
    if reply_code == 406:
        return PreconditionFailed(text, reply_code)
    if reply_code == 403:
        return AccessRefused(text, reply_code)
    return ChannelError(text, reply_code)


@contextmanager
def open_channel(settings: BrokerSettings) -> Iterator[Any]:
    """A connection and one channel on it, both closed on exit (errors translated)."""
    connection = connect(settings)
    try:
        try:
            channel = connection.channel()
        except Exception as e:
            raise translate(e, settings) from e
        yield channel
    finally:
        close_quietly(connection)


def close_quietly(connection: Any) -> None:
    """Close a pika connection, ignoring errors (it may already be dead)."""
    try:
        if connection is not None and connection.is_open:
            connection.close()
    except Exception:
        pass


def drop_connection(connection: Any) -> None:
    """End ``connection`` the way a crash does: close its TCP stream without basic.cancel or
    channel.close (pika's graceful close cancels every consumer first).

    Why: on basic.cancel single active consumer activates a standby at once, while this
    worker's held deliveries are still unacked on the closing channel, and pika hands the ones
    it buffered back with basic.nack first; the standby then runs a key's next message before
    the held earlier ones come back (found by ``chaos.py --ordered``). When the connection just
    goes, the broker requeues the unacked deliveries at their positions first and then
    activates the standby, which gets them in order. A stream consumer has the same need: a
    stream answers pika's basic.nack by closing the connection (540 NOT_IMPLEMENTED).

    Uses pika internals (``_impl._terminate_stream``, pika 1.3-1.4); falls back to the
    graceful close where they are missing or fail (logged as a warning). The broker logs the
    dropped connection as closed unexpectedly."""
    if connection is None or not connection.is_open:
        return
    impl = getattr(connection, "_impl", None)
    terminate = getattr(impl, "_terminate_stream", None)
    if terminate is None:
        close_quietly(connection)
        return
    try:
        # an error is required: None means "after Connection.CloseOk" and fails an assertion
        terminate(pe.StreamLostError("dropped by amqp-lab: end like a crash, no basic.cancel"))
        deadline = time.monotonic() + 5.0
        while connection.is_open and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.05)
    except Exception as e:
        if connection.is_open:
            log.warning("could not drop the connection (%r): closing it gracefully", e)
    close_quietly(connection)


class BlockedTime:
    """Measures how long a connection was blocked by the broker (connection.blocked, sent
    while a memory or disk alarm is in effect: https://www.rabbitmq.com/docs/connection-blocked)
    and reports each blocked period to ``report(seconds)`` when connection.unblocked arrives or
    the connection is closed. ``clock``: monotonic seconds."""

    def __init__(
        self, report: Callable[[float], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.report = report
        self.clock = clock
        self._since: float | None = None

    @property
    def blocked(self) -> bool:
        """Whether the watched connection is blocked now."""
        return self._since is not None

    def watch(self, connection: Any) -> None:
        """Follow ``connection`` (a pika BlockingConnection or SelectConnection). The
        underlying connection's callbacks are used: BlockingConnection dispatches its own only
        from ``process_data_events``, which a publisher waiting for a confirm never reaches
        before ``blocked_connection_timeout`` ends the connection."""
        impl = getattr(connection, "_impl", connection)
        impl.add_on_connection_blocked_callback(lambda *_: self.on_blocked())
        impl.add_on_connection_unblocked_callback(lambda *_: self.closed())

    def on_blocked(self) -> None:
        """connection.blocked was received (a second one while blocked changes nothing)."""
        if self._since is None:
            self._since = self.clock()

    def closed(self) -> None:
        """connection.unblocked was received, or the connection ended: report the period."""
        if self._since is not None:
            seconds, self._since = self.clock() - self._since, None
            self.report(max(0.0, seconds))
