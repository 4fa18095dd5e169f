"""The batcher's Prometheus metrics, in its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.metrics import FAST_BUCKETS, LATENCY_BUCKETS


class BatcherMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.batch_size = Histogram(
            "tw_batcher_batch_size",
            "requests per batch sent to a worker",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        self.window = Histogram(
            "tw_batcher_window_seconds",
            "arrival to dispatch decision per request",
            buckets=(*FAST_BUCKETS, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.handoff = Histogram(
            "tw_batcher_handoff_seconds",
            "dispatch decision to the batch acknowledged by Kafka",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.window_ms = Gauge(
            "tw_batcher_window_length_ms", "current sliding window length", registry=r
        )
        self.queue_depth = Gauge(
            "tw_batcher_queue_depth", "requests queued in the batcher", registry=r
        )
        self.queue_tokens = Gauge(
            "tw_batcher_queue_tokens", "tokens queued in the batcher", registry=r
        )
        self.paused = Gauge(
            "tw_batcher_paused", "1 while consumption is paused (backpressure)", registry=r
        )
        self.dead_letters = Counter(
            "tw_batcher_dead_letters", "messages sent to the DLQ", ["reason"], registry=r
        )
        self.requests = Counter(
            "tw_batcher_requests", "requests dispatched", ["priority"], registry=r
        )
        self.lag = Gauge(
            "tw_batcher_consumer_lag", "requests on the topic not yet consumed", registry=r
        )
