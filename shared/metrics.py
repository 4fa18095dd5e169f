"""Prometheus helpers: each service keeps its own registry and serves it on its own port
(``TW_METRICS_PORT``; 0 picks none), beside ``/healthz`` and ``/readyz`` probes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

# Readiness: each dependency's name and whether it answers now.
Readiness = Callable[[], Mapping[str, bool]]


def serve_metrics(
    registry: CollectorRegistry,
    port: int,
    host: str = "127.0.0.1",
    readiness: Readiness | None = None,
) -> None:
    """Expose ``registry`` at http://host:port/metrics (a daemon thread) when port > 0,
    with ``/healthz`` (the process answers) and ``/readyz`` (200 while every dependency
    ``readiness`` reports answers, else 503, with each one's state in JSON)."""
    if port <= 0:
        return
    server = ThreadingHTTPServer((host, port), _handler(registry, readiness))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", host, port)


def _handler(registry: CollectorRegistry, readiness: Readiness | None) -> type[MetricsHandler]:
    metrics = MetricsHandler.factory(registry)

    class Handler(metrics):  # type: ignore[valid-type,misc]
        """Serves /metrics, /healthz and /readyz."""

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._json(200, {"status": "ok"})
            elif path == "/readyz":
                deps = dict(readiness()) if readiness is not None else {}
                ok = all(deps.values())
                body: dict[str, Any] = {"status": "ok" if ok else "unavailable"}
                body.update({name: "ok" if up else "down" for name, up in deps.items()})
                self._json(200 if ok else 503, body)
            else:
                super().do_GET()

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = orjson.dumps(body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Probes every few seconds would flood the log."""

    return Handler
