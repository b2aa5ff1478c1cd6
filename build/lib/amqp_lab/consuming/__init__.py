"""Consuming: the manual-ack :class:`Consumer` (prefetch, batched acks, broker-held retries,
DLQ records, dedup), its :class:`ConsumerConfig`, the per-delivery :class:`DeliveryReport`
and :class:`SignalDrain` (SIGTERM/SIGINT drain)."""

from amqp_lab.consuming.consumer import Consumer, ConsumerConfig, Handler
from amqp_lab.consuming.delivery import DeliveryReport
from amqp_lab.consuming.lifecycle import SignalDrain, State

__all__ = ["Consumer", "ConsumerConfig", "DeliveryReport", "Handler", "SignalDrain", "State"]
