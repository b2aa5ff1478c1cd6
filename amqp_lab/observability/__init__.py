"""Observability: the instrumentation the library calls - W3C trace context and OpenTelemetry
spans (:mod:`.tracing`), JSON logs (:mod:`.logs`), the outcome names and report shape the log
and the metrics share (:mod:`.outcomes`) and guarded observers (:mod:`.guard`). It imports
nothing from the packages that use it (consuming, publishing, dlq, cli...). The Prometheus
metrics, the queue exporter's collector and the /metrics server are
:mod:`amqp_lab.exporters`. Import the submodules; this package imports nothing itself, so
the consumer pays only for what it uses."""

__all__ = ["guard", "logs", "outcomes", "tracing"]
