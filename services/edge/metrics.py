"""The edge's Prometheus metrics, in a registry of its own (never the global default, so
several apps in one process, as in tests, do not collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shared.retry import DependencyMetrics

__all__ = ["CONTENT_TYPE_LATEST", "EdgeMetrics"]


class EdgeMetrics:
    """Counters and gauges of one edge process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tw_edge_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
        self.rejected = Counter(
            "tw_edge_rejected", "requests refused before reaching Kafka", ["reason"], registry=r
        )
        self.submitted = Counter(
            "tw_edge_submitted", "generation requests published", ["endpoint"], registry=r
        )
        self.events = Counter("tw_edge_events_relayed", "token events relayed", registry=r)
        self.streams = Gauge("tw_edge_streams_active", "streams being relayed", registry=r)
        self.cancels = Counter("tw_edge_cancels", "cancellations sent", ["source"], registry=r)
        self.first_event = Histogram(
            "tw_edge_first_event_seconds",
            "request creation at the edge to its first event relayed",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.pubsub_reconnects = Gauge(
            "tw_edge_pubsub_reconnects", "reconnects of the shared subscriber", registry=r
        )
        self.redis_up = Gauge(
            "tw_edge_redis_up", "1 while Redis answers this edge's probe, else 0", registry=r
        )
        # Kafka's state as this edge's probe sees it (tw_edge_dependency_up{dependency="kafka"}).
        self.dependencies = DependencyMetrics(r, "edge")
        self.redis_retries = Counter(
            "tw_edge_redis_retries",
            "Redis calls tried again because Redis was away",
            ["call"],
            registry=r,
        )
        self.tracked = Gauge(
            "tw_edge_tracked_entries",
            "entries of the edge's per-request maps (they follow the open streams)",
            ["map"],
            registry=r,
        )
        self.queued = Gauge(
            "tw_edge_batcher_queued_requests", "requests queued in batchers (last read)", registry=r
        )

    def totals(self) -> dict[str, float]:
        """This process's requests answered, submitted and rejected since it started (all
        labels summed), and its open streams: what its heartbeat carries."""
        out = {}
        for name, metric in (
            ("requests", self.requests),
            ("submitted", self.submitted),
            ("rejected", self.rejected),
            ("streams", self.streams),
        ):
            out[name] = sum(
                s.value
                for family in metric.collect()
                for s in family.samples
                if not s.name.endswith("_created")
            )
        return out

    def render(self) -> bytes:
        """The exposition text (callers refresh the gauges they own first)."""
        return generate_latest(self.registry)
