"""One exception hierarchy for everything amqp-lab raises.

pika, httpx and sqlite errors are translated at the boundary (``raise ... from e``) into these
classes, so callers catch ``AmqpLabError`` or one of its few families and never import pika's
exception module. Handler code raises :class:`BusinessError` or :class:`TransientError` to say how
a failed delivery must be settled.
"""

from __future__ import annotations


class AmqpLabError(Exception):
    """Root of every error amqp-lab raises. ``str(e)`` is one line with no password in it."""


# --- configuration -----------------------------------------------------------------------------
class ConfigurationError(AmqpLabError):
    """Bad settings: a malformed EAI_AMQP_URL, an option out of range, unreadable topology data."""


# --- broker connection ------------------------------------------------------------------------
class BrokerConnectionError(AmqpLabError):
    """The AMQP connection could not be opened or was lost."""


class BrokerUnavailable(BrokerConnectionError):
    """Nothing answered at the URL's host and port (refused, timed out, DNS failure)."""


class AuthenticationFailed(BrokerConnectionError):
    """The broker refused the username or password (ACCESS_REFUSED during connection.start)."""


class VhostAccessDenied(BrokerConnectionError):
    """The vhost does not exist or the user has no permission on it (connection.open refused)."""


class ConnectionLost(BrokerConnectionError):
    """An open connection or channel died (socket closed, broker forced close, 320 shutdown)."""


class BrokerBlocked(BrokerConnectionError):
    """The broker kept the connection blocked (connection.blocked, e.g. a memory or disk alarm)
    for longer than ``blocked_connection_timeout``. https://www.rabbitmq.com/docs/connection-blocked
    """


# --- channel-level protocol errors ----------------------------------------------------------------
class ChannelError(AmqpLabError):
    """The broker closed a channel with a soft error; ``reply_code`` is the AMQP code (404...)."""

    def __init__(self, message: str, reply_code: int = 0) -> None:
        super().__init__(message)
        self.reply_code = reply_code


class PreconditionFailed(ChannelError):
    """406 PRECONDITION_FAILED, e.g. a queue redeclared with inequivalent arguments."""


class NotFound(ChannelError):
    """404 NOT_FOUND: the exchange or queue named does not exist in the vhost."""


class AccessRefused(ChannelError):
    """403 ACCESS_REFUSED: the user lacks configure/write/read permission for the resource."""


# --- publishing -----------------------------------------------------------------------------------
class PublishError(AmqpLabError):
    """A message was not confirmed by the broker. It must be treated as not published."""

    def __init__(self, message: str, message_id: str | None = None) -> None:
        super().__init__(message)
        self.message_id = message_id


class MessageUnroutable(PublishError):
    """basic.return: a mandatory message matched no queue. Retrying cannot help."""


class MessageNacked(PublishError):
    """basic.nack from the broker after retries ran out (e.g. a queue at max-length with
    overflow=reject-publish, or an internal error)."""


class PublishFailed(PublishError):
    """Retries ran out with the connection still failing; the message was not confirmed."""


# --- management HTTP API --------------------------------------------------------------------------
class ManagementError(AmqpLabError):
    """The management HTTP API answered with an error status or could not be reached."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


# --- topology -------------------------------------------------------------------------------------
class TopologyError(AmqpLabError):
    """The topology data is invalid or could not be applied."""


# --- consumer / DLQ -------------------------------------------------------------------------------
class DeadLetterFailed(AmqpLabError):
    """A DLQ record could not be published with a confirm; the original delivery was not acked."""


class DedupStoreError(AmqpLabError):
    """The de-duplication store failed (cannot open, cannot commit)."""


# --- handler-side classification ------------------------------------------------------------------
class HandlerError(AmqpLabError):
    """Base for errors a message handler raises to choose its settlement."""


class BusinessError(HandlerError):
    """The message itself is wrong (schema violation, missing reference). Retrying cannot help:
    it is dead-lettered at once."""


class TransientError(HandlerError):
    """A temporary condition (timeout, HTTP 503 or 429). The delivery is retried a bounded number
    of times, then dead-lettered."""


class InvalidMessage(BusinessError):
    """The delivery could not be decoded into a task (not JSON, wrong shape, no message_id...)."""
