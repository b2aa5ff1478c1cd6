"""Per-key ordering: the ordered consumer (retries that keep each key's order), its per-key
lines, parked keys, and the key distribution report (hot keys, hot shards). The topology side
is :mod:`amqp_lab.topology.ordered`; docs/ordering.md."""

from amqp_lab.ordering.config import OrderedConfig, key_of
from amqp_lab.ordering.consumer import OrderedConsumer
from amqp_lab.ordering.distribution import Alert, Distribution, Thresholds, analyze
from amqp_lab.ordering.holds import KeyLines
from amqp_lab.ordering.parking import ParkedKey, ParkedKeys

__all__ = [
    "Alert",
    "Distribution",
    "KeyLines",
    "OrderedConfig",
    "OrderedConsumer",
    "ParkedKey",
    "ParkedKeys",
    "Thresholds",
    "analyze",
    "key_of",
]
