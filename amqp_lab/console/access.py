"""Who may use the DLQ console (pure): the access token, its cookie, the CSRF token, and the
loopback rule.

The console shows payloads and headers (often personal data) and can replay or delete
messages, so:

* bound to anything but a loopback address it refuses to start without an access token
  (:func:`check_binding`); with a token, every request must carry it - ``?token=`` once (the
  console then sets an HttpOnly, SameSite=Strict cookie holding a value derived from it) or
  ``Authorization: Bearer <token>``;
* without a token (loopback only) it answers only requests whose ``Host`` is a loopback name,
  so a web page cannot reach it through DNS rebinding;
* every POST carries the process's CSRF token in a hidden field.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re

from amqp_lab.errors import ConfigurationError

__all__ = [
    "COOKIE_NAME",
    "TokenLogFilter",
    "bearer_token",
    "check_binding",
    "cookie_value",
    "host_is_loopback",
    "is_loopback",
    "same_secret",
]

COOKIE_NAME = "amqp_lab_console"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or host name, IPv6 with or without brackets) is a
    loopback address or name: 127.0.0.0/8, ::1, localhost. ``0.0.0.0`` and ``::`` are not."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_is_loopback(host_header: str) -> bool:
    """Whether an HTTP ``Host`` header (``name``, ``name:port``, ``[::1]:port``) names a
    loopback host."""
    value = host_header.strip()
    if value.startswith("["):
        return is_loopback(value[1 : value.find("]")] if "]" in value else value)
    name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return is_loopback(name)


def check_binding(host: str, token: str | None) -> None:
    """Raise ConfigurationError (one line) when the console would listen on ``host``, not a
    loopback address, without an access token."""
    if not token and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to listen on {host} without an access token: anyone who reaches it could "
            "read and replay the DLQ; pass --token or set EAI_CONSOLE_TOKEN (or use --host "
            "127.0.0.1)"
        )


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a supplied secret with the expected one."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


def cookie_value(token: str) -> str:
    """The session cookie's value for ``token``: an HMAC of it, so the cookie does not hold the
    token itself (it grants the same access, but the token cannot be read back from it)."""
    return hmac.new(token.encode("utf-8"), b"amqp-lab console cookie", hashlib.sha256).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


class TokenLogFilter(logging.Filter):
    """Masks the access token (``?token=...`` in a logged request line, or the token itself)
    in log records, e.g. werkzeug's request log."""

    def __init__(self, token: str | None) -> None:
        super().__init__()
        self.token = token
        self._query = re.compile(r"(token=)[^&\s\"']+")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = self._query.sub(r"\1***", message)
        if self.token:
            masked = masked.replace(self.token, "***")
        if masked != message:
            record.msg, record.args = masked, None
        return True
