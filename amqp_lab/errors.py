"""One exception hierarchy for everything amqp-lab raises.

pika, httpx and sqlite errors are translated at the boundary (``raise ... from e``) into these
classes, so callers catch ``AmqpLabError`` or one of its few families and never import pika's
exception module. Handler code raises :class:`BusinessError` or :class:`TransientError` to say how
a failed delivery must be settled.
"""

from __future__ import annotations

__all__ = [
    "AccessRefused",
    "AmqpLabError",
    "AuthenticationFailed",
    "BrokerBlocked",
    "BrokerConnectionError",
    "BrokerUnavailable",
    "BusinessError",
    "ChannelError",
    "ConfigurationError",
    "ConnectionLost",
    "ConsumerCancelled",
    "DeadLetterFailed",
    "DedupStoreError",
    "HandlerContractError",
    "HandlerError",
    "InvalidMessage",
    "KeyParked",
    "ManagementError",
    "MessageNacked",
    "MessageUnroutable",
    "NotFound",
    "OutboxError",
    "OutboxUnavailable",
    "PoisonMessage",
    "PreconditionFailed",
    "PublishError",
    "PublishFailed",
    "QueueNotFound",
    "QueueViewIncomplete",
    "RecordTooLarge",
    "ReplayStopped",
    "RetryTopologyError",
    "StoreUnavailable",
    "StoreVhostMismatch",
    "TopologyError",
    "TransactionTimedOut",
    "TransientError",
    "UnencodableMessage",
    "VhostAccessDenied",
    "error_text",
]


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


class QueueNotFound(NotFound):
    """The queue a consumer needs does not exist: missing at start, or deleted (the broker sent
    basic.cancel) and not back within the consumer's bound. ``queue`` and ``vhost`` name it."""

    def __init__(self, message: str, queue: str, vhost: str) -> None:
        super().__init__(message, 404)
        self.queue = queue
        self.vhost = vhost


class ConsumerCancelled(BrokerConnectionError):
    """The broker cancelled the consumer (basic.cancel): its queue was deleted, or the queue's
    node went away. The consumer resubscribes if the queue comes back within its bound."""


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


class UnencodableMessage(PublishError):
    """The message cannot be sent as it is: a property out of range (expiration not a string of
    0..315360000000 milliseconds, priority outside 0..255, a short string over 255 bytes) or a
    header value of a type AMQP cannot carry. Found before sending, so it fails alone and never
    closes the channel under the messages around it."""


# --- management HTTP API --------------------------------------------------------------------------
class ManagementError(AmqpLabError):
    """The management HTTP API answered with an error status or could not be reached."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class QueueViewIncomplete(ManagementError):
    """The management API answered for a queue without its settings: no
    ``effective_policy_definition``, no ``policy`` (and ``state`` often ``down``). RabbitMQ 4.3
    answers so for a quorum queue whose leader it cannot reach, for 2-5 s after that leader's
    node fails (measured on a three-node cluster: the 18-key view instead of 51), and
    RabbitMQ 3.10 for a quorum queue declared less than a statistics interval ago. The
    settings are unknown, not missing: ask again."""


# --- topology -------------------------------------------------------------------------------------
class TopologyError(AmqpLabError):
    """The topology data is invalid or could not be applied."""


class RetryTopologyError(TopologyError):
    """The live vhost cannot bring a message back the way the consumer's retry policy needs: a
    wait queue without the dead-letter exchange back to the work queue, a queue that expires,
    a missing binding - typically because an operator policy or a higher-priority policy
    replaced ours. The consumer refuses to start rather than confirm a retry copy into a queue
    it cannot come back from."""


# --- consumer / DLQ -------------------------------------------------------------------------------
class DeadLetterFailed(AmqpLabError):
    """A DLQ record could not be published with a confirm; the original delivery was not acked."""


class RecordTooLarge(DeadLetterFailed):
    """A DLQ record or retry copy the broker cannot take for its size: a body over the
    broker's ``max_message_size`` (``limit``, bytes, when the broker named it), or headers
    that fill one frame. Retrying the same write cannot help."""

    def __init__(self, message: str, limit: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit


class ReplayStopped(AmqpLabError):
    """A bounded pass over the DLQ (replay, delete) stopped before its end: a record it had to
    move past could not be copied to the DLQ's tail, or not one record could be handled within
    the time bound. Nothing is lost: every record is still in the DLQ (amqp_lab.dlq.window)."""


class DedupStoreError(AmqpLabError):
    """The de-duplication store failed (cannot open, cannot commit)."""


class StoreUnavailable(DedupStoreError):
    """The store cannot be reached right now: its connection was lost (PostgreSQL restarted, the
    session terminated) or SQLite stayed locked past its timeout. Nothing was committed; the
    consumer retries with backoff, and only an outage longer than its bound ends the worker."""


class StoreVhostMismatch(DedupStoreError):
    """The dedup store was bound to another vhost: its claims would ack this vhost's messages
    as duplicates. One store serves one vhost (:func:`amqp_lab.dedup.identity.bind_vhost`)."""


# --- handler-side classification ------------------------------------------------------------------
class OutboxError(AmqpLabError):
    """The outbox table could not be read or written (amqp_lab.outbox): missing, refused, or
    a statement failed. The caller's transaction is to be rolled back."""


class OutboxUnavailable(OutboxError):
    """The outbox's database cannot be reached right now (connection refused or lost, the
    server restarting, SQLite locked past its busy timeout): retrying later can help."""


class HandlerError(AmqpLabError):
    """Base for errors a message handler raises to choose its settlement."""


class BusinessError(HandlerError):
    """The message itself is wrong (schema violation, missing reference). Retrying cannot help:
    it is dead-lettered at once."""


class TransientError(HandlerError):
    """A temporary condition (timeout, HTTP 503 or 429). The delivery is retried a bounded number
    of times, then dead-lettered."""


class TransactionTimedOut(TransientError):
    """PostgreSQL ended the dedup store's transaction while a handler held it: idle longer than
    the server's ``idle_in_transaction_session_timeout`` (SQLSTATE 25P03) or open longer than
    its ``transaction_timeout`` (PostgreSQL 17, 25P04). Nothing of it was committed. The
    handler's failure, retried a bounded number of times and then dead-lettered: not an outage
    of the store, whose retries would run the handler again and again until the worker
    stopped, and then on the next worker (:mod:`amqp_lab.dedup.timeouts`)."""


class InvalidMessage(BusinessError):
    """The delivery could not be decoded into a task (not JSON, wrong shape, no message_id...)."""


class PoisonMessage(BusinessError):
    """The broker redelivered the message more often than the consumer allows without it ever
    being settled: its handler probably kills the worker (a segfault, the OOM killer,
    ``os._exit``). Dead-lettered without running the handler again."""


class KeyParked(BusinessError):
    """Ordered mode with ``after_dead_letter="park"``: an earlier message of the same key was
    dead-lettered, so this one goes to the DLQ behind it instead of running out of order.
    Replaying the key's records (``replay.py --key KEY``) releases it (docs/ordering.md)."""


class HandlerContractError(BusinessError):
    """The handler returned something its caller cannot honour as "ran to the end": a
    generator or async generator (its body never ran), a ``concurrent.futures.Future`` or an
    awaitable of another event loop (the work runs elsewhere), or an async handler that left
    tasks running on its event loop (their writes would escape the transaction). Retrying
    cannot help: the delivery is dead-lettered at once, naming the handler."""


def error_text(error: BaseException, limit: int = 2000) -> str:
    """``str(error)``, at most ``limit`` characters, never raising: a handler's exception is
    hostile input too - its ``__str__`` may raise or return something that is not a str."""
    try:
        text = str(error)
    except Exception as e:  # an __str__ that raises (or returns a non-str: TypeError)
        text = f"<str() of {type(error).__name__} raised {type(e).__name__}>"
    return text[:limit]
