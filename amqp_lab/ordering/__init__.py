"""Per-key ordering: shard by entity key over a consistent-hash exchange (docs/ordering.md)."""

from amqp_lab.ordering.distribution import Alert, Distribution, Thresholds, analyze

__all__ = ["Alert", "Distribution", "Thresholds", "analyze"]
