"""What a :class:`~amqp_lab.consuming.consumer.Consumer` is told: the handler's signature
(:data:`Handler`) and :class:`ConsumerConfig`, validated when it is made (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from amqp_lab.errors import ConfigurationError
from amqp_lab.message import DEFAULT_MAX_BODY_BYTES, Task
from amqp_lab.publishing.confirm_deadline import DEFAULT_CONFIRM_TIMEOUT
from amqp_lab.retry.policy import REQUEUE_ONCE, RetryPolicy
from amqp_lab.topology.model import Names
from amqp_lab.topology.retry_check import RetryExpectations

__all__ = ["ConsumerBounds", "ConsumerConfig", "EngineConfig", "Handler"]

Handler = Callable[[Task, Any], None]
"""``handler(task, db)``: do the work; ``db`` is the dedup store's connection, inside the
transaction that also records the message_id (with ``ack_batch`` > 1 and a store that has
``process_batch``, a :class:`~amqp_lab.dedup.HandlerDb` over the batch's one
transaction: use ``db.execute`` and friends, never commit). Raise BusinessError or
TransientError (or any exception, treated as unknown: retried like a transient one) to fail."""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What the consumer engine (:mod:`amqp_lab.consuming.engine`) is told, whichever consumer
    it serves: ``dlx`` (where DLQ records go), ``expectations`` (what the topology guard checks
    at every connection), ``handler_threads``, and the bounds of :class:`ConsumerBounds`."""

    dlx: str
    expectations: RetryExpectations
    verify_topology: bool = True
    handler_threads: int = 1
    reconnect_attempts: int = 10
    store_outage: float = 60.0
    dead_letter_attempts: int = 3
    max_message_size: int | None = None
    confirm_timeout: float | None = DEFAULT_CONFIRM_TIMEOUT


@dataclass(frozen=True, kw_only=True)
class ConsumerBounds:
    """The failure model's bounds every consumer has (keyword-only; seconds or counts): see
    :class:`ConsumerConfig`. :meth:`engine_config` gives the engine its part."""

    max_redeliveries: int = 3
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    reconnect_attempts: int = 10
    store_outage: float = 60.0
    dead_letter_attempts: int = 3
    verify_topology: bool = True
    max_message_size: int | None = None
    confirm_timeout: float | None = DEFAULT_CONFIRM_TIMEOUT

    def check_bounds(self) -> None:
        """Raise ConfigurationError for a count below 1 or a negative duration."""
        if min(self.max_redeliveries, self.reconnect_attempts, self.dead_letter_attempts) < 1:
            raise ConfigurationError(
                "max_redeliveries, reconnect_attempts and dead_letter_attempts must be >= 1"
            )
        if not self.store_outage >= 0:
            raise ConfigurationError(f"store_outage must be >= 0 seconds, not {self.store_outage}")
        if self.confirm_timeout is not None and not self.confirm_timeout > 0:
            raise ConfigurationError(
                f"confirm_timeout must be > 0 seconds or None, not {self.confirm_timeout}"
            )

    def engine_config(
        self, dlx: str, expectations: RetryExpectations, handler_threads: int = 1
    ) -> EngineConfig:
        """What the consumer engine is told: these bounds, where DLQ records go, what the
        topology guard checks, how many handler threads."""
        return EngineConfig(
            dlx=dlx,
            expectations=expectations,
            verify_topology=self.verify_topology,
            handler_threads=handler_threads,
            reconnect_attempts=self.reconnect_attempts,
            store_outage=self.store_outage,
            dead_letter_attempts=self.dead_letter_attempts,
            max_message_size=self.max_message_size,
            confirm_timeout=self.confirm_timeout,
        )


@dataclass(frozen=True)
class ConsumerConfig(ConsumerBounds):
    """``names``: the topology's roles (``topology.names``): the work queue, the DLX, the wait
    queues; ``prefetch``: basic.qos prefetch_count; ``idle_exit``: seconds without a delivery before
    :meth:`Consumer.run` returns (None: never); ``max_messages``: return after that many
    deliveries; ``max_body_bytes``: larger bodies are business errors; ``dead_letter``:
    ``publish`` (confirmed DLQ record, default) or ``reject`` (broker DLX, x-death);
    ``retry``: requeue once (default) or broker-held backoff through wait queues of
    ``retry_exchange``; ``ack_batch``: deliveries handled in one store transaction and acked with
    one basic.ack(multiple=True) after its commit; ``ack_interval``: seconds a partial batch may
    wait (it starts at once when nothing more is buffered and no batch runs). With batches, a
    prefetch of 3 * ack_batch keeps deliveries flowing while one batch commits and the next is
    decoded (measured: +8% msg/s over 2 * ack_batch).

    The failure model's bounds, all in seconds or counts:

    * ``reconnect_attempts``: connections in a row that settle nothing before giving up;
    * ``queue_wait``: how long a queue missing at start is waited for (0: fail at once);
      ``resubscribe_wait``: how long a queue that was deleted (basic.cancel) may take to come
      back before the consumer gives up;
    * ``max_redeliveries``: broker redeliveries of one message_id (counted in the store before
      each handler run, so a crash cannot lose the count) before it is dead-lettered as poison
      without running the handler;
    * ``store_outage``: how long the dedup store may stay unavailable (deliveries retried,
      nothing acked) before the consumer stops;
    * ``dead_letter_attempts``: tries of one DLQ or retry write before the delivery is parked;
    * ``confirm_timeout``: seconds one DLQ or retry write waits for its publisher confirm,
      time blocked by the broker (connection.blocked) not counted, before the connection is
      dropped (its deliveries come back; None: no limit):
      :mod:`amqp_lab.publishing.confirm_deadline`;
    * ``max_message_size``: the broker's limit in bytes (its ``max_message_size``), None while
      unknown: a DLQ record over it is sent in its raw form (the body as it is); the broker's
      refusal of a larger one teaches it (docs/dlq-record.md);
    * ``verify_topology``: check the effective policies retries depend on at every connection
      (management API; backoff and reject modes);
    * ``handler_warn_after``: seconds a handler may run before the consumer logs a warning
      naming the message_id, the queue and the seconds so far, once per delivery (None: never).
      It does not stop the handler (a Python thread cannot be killed): the delivery stays
      unacked until the handler returns. RabbitMQ 4.3 classic queues enforce no
      consumer_timeout any more, so this warning is all that tells of a stuck handler there; on
      a quorum queue with a consumer timeout the broker cancels the consumer past it and
      requeues the message, which another worker may then run in parallel (the dedup store
      keeps one effect). Only SIGKILL stops a stuck handler; its message is then redelivered.
      docs/rabbitmq-versions.md.
    """

    names: Names
    prefetch: int = 10
    dead_letter: Literal["publish", "reject"] = "publish"
    idle_exit: float | None = None
    max_messages: int | None = None
    retry: RetryPolicy = REQUEUE_ONCE
    ack_batch: int = 1
    ack_interval: float = 0.005
    queue_wait: float = 0.0
    resubscribe_wait: float = 30.0
    concurrency: int = 1
    handler_warn_after: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.ack_batch <= self.prefetch:
            raise ConfigurationError(
                f"ack_batch {self.ack_batch} must be within 1..prefetch ({self.prefetch}): the "
                "broker sends no more than prefetch unacked deliveries"
            )
        self.check_bounds()
        if self.concurrency < 1:
            raise ConfigurationError("concurrency must be >= 1")
        if not (self.queue_wait >= 0 and self.resubscribe_wait >= 0):
            raise ConfigurationError("queue_wait and resubscribe_wait must be >= 0 seconds")
        if self.handler_warn_after is not None and not self.handler_warn_after > 0:
            raise ConfigurationError(
                f"handler_warn_after must be > 0 seconds (or None), not {self.handler_warn_after}"
            )
        if self.concurrency * self.ack_batch > self.prefetch:
            raise ConfigurationError(
                f"concurrency {self.concurrency} x ack_batch {self.ack_batch} needs a prefetch of "
                f"at least {self.concurrency * self.ack_batch} (it is {self.prefetch}): the broker "
                "sends no more than prefetch unacked deliveries, so handlers would sit idle; "
                f"{2 * self.concurrency * self.ack_batch} keeps them all busy"
            )
        if self.retry.mode == "hold":
            raise ConfigurationError(
                "retry mode hold (retries held in the worker) is the ordered consumer's: "
                "OrderedConfig, worker.py --ordered N"
            )
        if self.retry.mode == "backoff" and (
            self.names.retry_exchange is None or self.retry.max_attempts > self.names.max_attempts
        ):
            raise ConfigurationError(
                f"backoff with max_attempts {self.retry.max_attempts} needs a retry exchange and "
                f"{self.retry.max_attempts - 1} wait queues; the topology has "
                f"{self.names.wait_queues}"
            )

    @property
    def queue(self) -> str:
        """The work queue consumed (``names.queue``)."""
        return self.names.queue

    def retry_expectations(self, vhost: str) -> RetryExpectations:
        """What the live topology must provide for this config: the retry path its retry mode
        uses, the work queue's DLX in reject mode, and a DLQ that keeps every record."""
        names = self.names
        waits = (
            tuple(names.wait_queue(n) for n in range(1, self.retry.max_attempts))
            if self.retry.mode == "backoff"
            else ()
        )
        dlx = names.dead_letter_exchange if self.dead_letter == "reject" else None
        return RetryExpectations(
            vhost, names.queue, waits, names.retry_exchange or "", dlx, names.dlq
        )
