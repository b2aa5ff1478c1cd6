"""The ordered consumer's settings (pure): :class:`OrderedConfig`, the line a delivery joins
(:func:`key_of`) and the scope of parked keys (:func:`parked_scope`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from amqp_lab.consuming.config import ConsumerBounds, ConsumerConfig
from amqp_lab.consuming.delivery import Delivery
from amqp_lab.errors import ConfigurationError
from amqp_lab.retry.policy import RetryPolicy
from amqp_lab.topology.model import Names

__all__ = ["ORDERED_RETRY", "OrderedConfig", "key_of", "parked_scope"]

ORDERED_RETRY = RetryPolicy("hold", max_attempts=5, base=0.5, cap=10.0)


@dataclass(frozen=True)
class OrderedConfig(ConsumerBounds):
    """``names``: an ordered topology's roles (``shards`` > 0); ``prefetch``: basic.qos
    prefetch_count per shard consumer - held deliveries occupy it; ``retry``: in-worker
    retries (``max_attempts`` tries in all, full-jitter waits of ``base``..``cap`` seconds;
    whatever its mode, it is held in the worker: mode ``hold``); ``after_dead_letter``:
    ``continue`` or ``park`` (module docstring);
    ``idle_exit`` seconds without a delivery and nothing held before :meth:`run` returns;
    ``max_messages``: return after that many settled; the other bounds as in
    :class:`~amqp_lab.consuming.ConsumerConfig`, ``verify_topology`` checking the DLQ's
    policies at every connection. Raises ConfigurationError for a topology without shards or
    bounds below 1."""

    names: Names
    prefetch: int = 50
    retry: RetryPolicy = ORDERED_RETRY
    after_dead_letter: Literal["continue", "park"] = "continue"
    idle_exit: float | None = None
    max_messages: int | None = None

    def __post_init__(self) -> None:
        if not self.names.shards:
            raise ConfigurationError(
                "the ordered consumer needs the ordered topology (with_ordered, --ordered N)"
            )
        self.check_bounds()
        if self.prefetch < 1:
            raise ConfigurationError("prefetch must be >= 1")
        if not 1 <= self.retry.max_attempts <= 100:
            raise ConfigurationError(
                f"max_attempts must be within 1..100 (tries in the worker), not "
                f"{self.retry.max_attempts}"
            )
        if self.after_dead_letter not in ("continue", "park"):
            raise ConfigurationError(f"after_dead_letter {self.after_dead_letter!r}")
        if self.retry.mode != "hold":  # its retries are always held in the worker
            object.__setattr__(self, "retry", dataclasses.replace(self.retry, mode="hold"))

    def consumer_config(self) -> ConsumerConfig:
        """The plain consumer's settings the shared handler and dead-letter code read."""
        return ConsumerConfig(
            self.names,
            prefetch=self.prefetch,
            max_redeliveries=self.max_redeliveries,
            max_body_bytes=self.max_body_bytes,
            dead_letter_attempts=self.dead_letter_attempts,
            store_outage=self.store_outage,
            verify_topology=False,
            max_message_size=self.max_message_size,
        )


def parked_scope(vhost: str, names: Names) -> str:
    """The scope of an ordered topology's parked keys: ``vhost/entry-exchange``. A store
    serves one vhost (:mod:`amqp_lab.dedup.identity`); the vhost stays in the scope so that rows
    written before a store was bound, and ``keys.py parked`` reading any store, stay
    unambiguous."""
    return f"{vhost}/{names.exchange}"


def key_of(d: Delivery) -> str:
    """A delivery's key for its line: its routing key, which is what the consistent-hash
    exchange placed it by (our publisher sets the ``key`` header to the same value). A
    foreign publisher's ``key`` header that says otherwise is ignored here: lining up by it
    could run one key on two shards at once."""
    return str(d.method.routing_key)
