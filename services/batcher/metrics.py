"""The batcher's Prometheus metrics, in its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.metrics import FAST_BUCKETS, LATENCY_BUCKETS
from shared.retry import DependencyMetrics

# The index label of a retrieval naming no index there is (the name is the client's: not
# a label value, or any client could mint series).
NO_SUCH_INDEX = "-"


class RetrievalMetrics:
    """Retrieval in the batcher: requests grounded by index and result (``ok`` or the
    refusal's code), passages placed in prompts, and the time a dispatch's retrieval takes
    (one embedding call and a search per index, off the event loop)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            "tw_batcher_retrievals",
            "requests grounded, by index and result (ok, or the refusal's code: "
            "unknown_index, no_indexes, embedder_mismatch, corrupt_index, retrieval_error)",
            ["index", "result"],
            registry=r,
        )
        self.passages = Counter(
            "tw_batcher_retrieval_passages",
            "passages placed in prompts, by index",
            ["index"],
            registry=r,
        )
        self.seconds = Histogram(
            "tw_batcher_retrieval_seconds",
            "time to ground one dispatch's requests (embedding and searches)",
            buckets=(*FAST_BUCKETS, 2.5, 5.0, 10.0),
            registry=r,
        )


class BatcherMetrics:
    """Owns the batcher's metrics registry: batching and queue state, and the failures it
    rides out (dependencies, Kafka errors, rejected messages, refused workers)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._batching(r)
        self._faults(r)
        self.retrieval = RetrievalMetrics(r)

    def _batching(self, r: CollectorRegistry) -> None:
        """Batch sizes, window and handoff latencies, queue, dispatch and lag."""
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

    def _faults(self, r: CollectorRegistry) -> None:
        """Riding out Redis and Kafka: tw_batcher_dependency_up / _outages_total, and every
        failure caught on the way (what failed, and with which error)."""
        self.dependencies = DependencyMetrics(r, "batcher")
        self.kafka_errors = Counter(
            "tw_batcher_kafka_errors",
            "Kafka calls failed and retried (op: batch, dead_letter, commit, fetch)",
            ["op", "error"],
            registry=r,
        )
        self.error_events = Counter(
            "tw_batcher_error_events",
            "error events for rejected requests (outcome: published, stream_ended, conflict)",
            ["outcome"],
            registry=r,
        )
        self.rejects_pending = Gauge(
            "tw_batcher_rejects_pending",
            "rejected messages whose dead letter or error event waits for Kafka or Redis",
            registry=r,
        )
        self.bad_heartbeats = Counter(
            "tw_batcher_bad_heartbeats", "worker heartbeats that did not decode", registry=r
        )
        self.refused_workers = Gauge(
            "tw_batcher_refused_workers",
            "live workers never routed to: their block size or affinity depth differs from "
            "this batcher's (reason: block_size, affinity_depth)",
            ["reason"],
            registry=r,
        )
        self.requeued = Counter(
            "tw_batcher_requeued", "requests put back in the queue after a failed send", registry=r
        )
        self.slots_short = Counter(
            "tw_batcher_slots_short",
            "requests put back in the queue: other batchers had reserved their worker's slots",
            registry=r,
        )
