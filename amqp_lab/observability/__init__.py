"""Observability: Prometheus metrics (:mod:`.metrics`), W3C trace context and OpenTelemetry
spans (:mod:`.tracing`), JSON logs (:mod:`.logs`), and the queue-side exporter
(:mod:`.queues`). docs/operating.md says how to run them. Import the submodules; this package
imports nothing itself, so the consumer pays only for what it uses."""

__all__ = ["guard", "logs", "metrics", "queues", "tracing"]
