"""Prometheus helpers: each service keeps its own registry and serves it on its own port
(``TW_METRICS_PORT``; 0 picks none)."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> None:
    """Expose ``registry`` at http://host:port/metrics (a daemon thread) when port > 0."""
    if port > 0:
        start_http_server(port, addr=host, registry=registry)
        log.info("metrics on http://%s:%d/metrics", host, port)
