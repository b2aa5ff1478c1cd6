"""Per-key ordering: the ordered consumer (retries that keep each key's order), its per-key
lines, parked keys. The topology side is :mod:`amqp_lab.topology.ordered`; docs/ordering.md."""

from amqp_lab.ordering.consumer import OrderedConfig, OrderedConsumer, key_of
from amqp_lab.ordering.holds import KeyLines
from amqp_lab.ordering.parking import ParkedKey, ParkedKeys

__all__ = ["KeyLines", "OrderedConfig", "OrderedConsumer", "ParkedKey", "ParkedKeys", "key_of"]
