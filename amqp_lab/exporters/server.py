"""The /metrics endpoint: a registry served in the Prometheus text format over HTTP, on a
daemon thread (prometheus-client's own server). The worker, the publisher, the queue exporter
and the outbox relay serve their metrics with :func:`serve_metrics`, without ``_created``
series."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics
from prometheus_client.exposition import start_http_server

__all__ = ["serve_metrics"]


def serve_metrics(
    port: int, host: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` as ``http://host:port/metrics`` on a daemon thread; returns
    (server, thread). Port 0 picks a free port (``server.server_port``). prometheus-client's
    ``_created`` series are turned off (process-wide): nothing reads them. Raises OSError
    when the port is taken or the address is not this host's."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread
