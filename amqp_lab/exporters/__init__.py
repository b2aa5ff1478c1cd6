"""Exporters: what turns amqp-lab's observations into Prometheus metrics - a worker's and a
publisher's metrics (:mod:`.metrics`, the observers the consumers and publishers call), the
queue exporter's collector (:mod:`.queues`, asked by the broker on each scrape) and the
/metrics HTTP server (:mod:`.server`). The instrumentation the library calls itself (observer
protocols, tracing, logs, outcome names) is :mod:`amqp_lab.observability`. Import the
submodules; this package imports nothing itself. docs/operating.md says how to run them."""

__all__ = ["metrics", "queues", "server"]
