"""Broker settings: the AMQP URL or URLs (vhost included), the management API base, and secret
masking.

Only ``scripts/`` read environment variables; the library receives a :class:`BrokerSettings`.

**Several brokers (a cluster).** ``amqp_url`` may list several nodes, comma-separated:
``amqp://u:p@rmq1:5672/vh,amqp://u:p@rmq2:5672/vh``. Every URL must name the same vhost and
credentials. A connection goes to any node that answers and, once lost, to the next
(:func:`amqp_lab.connection.connect`); https://www.rabbitmq.com/docs/clustering#clients.
A comma only separates URLs where it is followed by ``amqp://`` or ``amqps://``, so a comma in
a password is kept. ``management_url`` takes the same list form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from amqp_lab.errors import ConfigurationError

__all__ = [
    "DEFAULT_MANAGEMENT_PORT",
    "BrokerSettings",
    "mask_secrets",
    "mask_url",
]

DEFAULT_MANAGEMENT_PORT = 15672
# Greedy up to the last "@" of the token: a raw "@" in a password must not end the mask early.
_PASSWORD_IN_URL = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)\S*@")
# where a list of URLs has its next URL: each is masked on its own
_NEXT_URL = re.compile(r"(,\s*)(?=[a-zA-Z][a-zA-Z0-9+.-]*://)")
_AMQP_LIST_SEPARATOR = re.compile(r"\s*,\s*(?=amqps?://)")
_HTTP_LIST_SEPARATOR = re.compile(r"\s*,\s*(?=https?://)")


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``; safe for logs and error messages.
    In a comma-separated list each URL is masked on its own."""
    pieces = _NEXT_URL.split(url)
    return "".join(_PASSWORD_IN_URL.sub(r"\g<head>***@", piece) for piece in pieces)


def mask_secrets(text: str, *secrets: str) -> str:
    """Mask URL passwords in ``text`` and every literal in ``secrets`` (e.g. a bare password)."""
    text = mask_url(text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker is and how to talk to it.

    ``amqp_url``: ``amqp://user:pass@host:port/vhost`` or ``amqps://...``; the path is the vhost,
    percent-encoded (``%2F`` is ``/``; an empty path means ``/``). Or several such URLs,
    comma-separated (the nodes of a cluster), all with the same vhost and credentials:
    :attr:`amqp_urls` lists them, :meth:`addresses` gives one settings object per node, and
    ``host`` / ``port`` are the first node's.
    ``management_url``: base of the management HTTP API, e.g. ``http://host:15672``, or several,
    comma-separated; derived from the AMQP URLs (same hosts, port 15672, same credentials) when
    not given.
    ``heartbeat``: seconds; ``blocked_connection_timeout``: seconds a connection may stay blocked
    by a resource alarm before it is closed with :class:`~amqp_lab.errors.BrokerBlocked`.
    """

    amqp_url: str
    management_url: str | None = None
    heartbeat: int = 30
    blocked_connection_timeout: float = 30.0
    connection_name: str = "amqp-lab"
    _parts: tuple[str, str, int, str, str, str] = field(init=False, repr=False, compare=False)
    _urls: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.amqp_url and self.amqp_url.strip().endswith(","):
            raise ConfigurationError(
                f"AMQP URL list {mask_url(self.amqp_url)!r} ends with a comma: remove it"
            )
        urls = _AMQP_LIST_SEPARATOR.split(self.amqp_url.strip()) if self.amqp_url else [""]
        parsed = [_parse_amqp_url(url) for url in urls]
        first = parsed[0]
        for url, parts in zip(urls[1:], parsed[1:], strict=True):
            if parts[3:] != first[3:]:
                raise ConfigurationError(
                    f"AMQP URL list: {mask_url(url)!r} names another vhost or other credentials "
                    f"than {mask_url(urls[0])!r}; every node of the list must use the same"
                )
        object.__setattr__(self, "_parts", first)
        object.__setattr__(self, "_urls", tuple(urls))
        if self.management_url is not None:
            for url in _HTTP_LIST_SEPARATOR.split(self.management_url.strip()):
                _check_http_url(url)

    def __repr__(self) -> str:
        return f"BrokerSettings(amqp_url={self.masked_url!r}, vhost={self.vhost!r})"

    @property
    def amqp_urls(self) -> tuple[str, ...]:
        """Every node's AMQP URL, in the order given (one for a single broker)."""
        return self._urls

    def addresses(self) -> tuple[BrokerSettings, ...]:
        """One settings object per node of :attr:`amqp_urls`, each with a single AMQP URL and
        its own management base (the i-th of a management URL list, else derived from its
        host), the rest unchanged."""
        if len(self._urls) == 1:
            return (self,)
        bases = self._management_urls()
        return tuple(
            replace(
                self,
                amqp_url=url,
                management_url=bases[i] if bases and i < len(bases) else None,
            )
            for i, url in enumerate(self._urls)
        )

    def _management_urls(self) -> list[str]:
        if self.management_url is None:
            return []
        return _HTTP_LIST_SEPARATOR.split(self.management_url.strip())

    @property
    def scheme(self) -> str:
        return self._parts[0]

    @property
    def host(self) -> str:
        return self._parts[1]

    @property
    def port(self) -> int:
        return self._parts[2]

    @property
    def vhost(self) -> str:
        """The vhost named by the URL's path (decoded)."""
        return self._parts[3]

    @property
    def username(self) -> str:
        return self._parts[4]

    @property
    def password(self) -> str:
        return self._parts[5]

    @property
    def masked_url(self) -> str:
        """The AMQP URL with the password (however it is written) replaced by ``***``."""
        masked = mask_url(", ".join(self._urls))
        if self.password and self.password not in ("guest", "***"):
            masked = masked.replace(self.password, "***")
        return masked

    @property
    def management_base(self) -> str:
        """Management API base URL without credentials, e.g. ``http://127.0.0.1:15672`` (the
        first of :attr:`management_bases`)."""
        return self.management_bases[0]

    @property
    def management_bases(self) -> tuple[str, ...]:
        """Every management API base without credentials: the ``management_url`` list, else one
        per AMQP URL (its host, port 15672)."""
        urls = self._management_urls()
        if not urls:
            return tuple(_derived_management_base(a.host) for a in self._single_addresses())
        return tuple(_strip_credentials(url) for url in urls)

    def _single_addresses(self) -> tuple[BrokerSettings, ...]:
        if len(self._urls) == 1:
            return (self,)
        return tuple(replace(self, amqp_url=url, management_url=None) for url in self._urls)

    @property
    def management_credentials(self) -> tuple[str, str]:
        """(username, password) for the management API: the management URL's, else the AMQP's."""
        if self.management_url is not None:
            parts = urlsplit(self._management_urls()[0])
            if parts.username is not None:
                return unquote(parts.username), unquote(parts.password or "")
        return self.username, self.password

    def with_vhost(self, vhost: str) -> BrokerSettings:
        """The same broker (every node of the list) and credentials, another vhost."""
        urls = []
        for one in self._urls:
            parts = urlsplit(one)
            path = "/" + quote(vhost, safe="")
            urls.append(urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")))
        return BrokerSettings(
            amqp_url=",".join(urls),
            management_url=self.management_url,
            heartbeat=self.heartbeat,
            blocked_connection_timeout=self.blocked_connection_timeout,
            connection_name=self.connection_name,
        )


def _parse_amqp_url(url: str) -> tuple[str, str, int, str, str, str]:
    """Validate an AMQP URL; return (scheme, host, port, vhost, username, password).

    Raises ConfigurationError with the masked URL when the scheme, host or port is wrong.
    Follows https://www.rabbitmq.com/docs/uri-spec (vhost percent-encoded in the path).
    """
    if not url or not url.strip():
        raise ConfigurationError("EAI_AMQP_URL is empty: expected amqp://user:pass@host:5672/vhost")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        # ValueError's text can quote part of the password (e.g. "Port could not be cast..."),
        # so it is not repeated here.
        raise ConfigurationError(
            f"malformed AMQP URL {mask_url(url)!r}: the port is not a number (a raw '/', '?' "
            "'#' or '@' in the password must be percent-encoded)"
        ) from e
    if parts.scheme not in ("amqp", "amqps"):
        raise ConfigurationError(
            f"AMQP URL {mask_url(url)!r} must start with amqp:// or amqps://, not {parts.scheme!r}"
        )
    if not parts.hostname:
        raise ConfigurationError(f"AMQP URL {mask_url(url)!r} has no host")
    if port == 0:
        raise ConfigurationError(f"AMQP URL {mask_url(url)!r}: port 0 is not a broker port")
    if port is None:
        port = 5671 if parts.scheme == "amqps" else 5672
    path = parts.path
    vhost = "/" if path in ("", "/") else unquote(path[1:])
    if "/" in path[1:]:
        raise ConfigurationError(
            f"AMQP URL {mask_url(url)!r}: the vhost must be one path segment; write '/' as %2F"
        )
    username = unquote(parts.username) if parts.username is not None else "guest"
    password = unquote(parts.password) if parts.password is not None else "guest"
    return parts.scheme, parts.hostname, port, vhost, username, password


def _derived_management_base(host: str) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{DEFAULT_MANAGEMENT_PORT}"


def _strip_credentials(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def _check_http_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError as e:
        # ValueError's text can quote part of the password, so it is not repeated here
        raise ConfigurationError(
            f"malformed management URL {mask_url(url)!r}: the port is not a number"
        ) from e
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"management URL {mask_url(url)!r} must look like http://host:15672"
        )
