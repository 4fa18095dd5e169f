"""The worker's Prometheus metrics (vLLM-style names under ``tw_``), in its own registry."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.worker.engine.wire import EngineStats
from shared.messages import GenerateRequest, TokenEvent
from shared.metrics import FAST_BUCKETS, LATENCY_BUCKETS
from shared.retry import DependencyMetrics


class WorkerMetrics:
    """Owns the worker's metrics registry: request latencies, engine counters and gauges,
    failures and dependency states; ``refresh`` turns engine stats into counter steps."""

    def __init__(self, worker_id: str) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        lbl = {"worker": worker_id}
        self._latencies(r)
        self._engine(r)
        self._faults(r)
        self.deps = DependencyMetrics(r, "worker")
        self.info = Gauge("tw_worker_info", "worker identity", list(lbl), registry=r)
        self.info.labels(**lbl).set(1)
        self._preempted_seen = 0
        self._prefilled_seen = 0
        self._steps_seen = 0
        self._spec_seen = (0, 0, 0)
        self._busy_seen = 0.0
        self._last_event: dict[str, float] = {}

    def _latencies(self, r: CollectorRegistry) -> None:
        """Request latency histograms."""
        self.ttft = Histogram(
            "tw_time_to_first_token_seconds",
            "request creation to its first token published",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "tw_inter_token_latency_seconds",
            "time between successive token events of a request",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "tw_e2e_request_latency_seconds",
            "request creation to its final event",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "tw_request_queue_time_seconds",
            "request creation to the worker starting it",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def _engine(self, r: CollectorRegistry) -> None:
        """Token, step and occupancy counters and gauges of the engine."""
        self.prompt_tokens = Counter(
            "tw_prompt_tokens", "prompt tokens of finished requests", registry=r
        )
        self.generation_tokens = Counter("tw_generation_tokens", "tokens generated", registry=r)
        self.prefix_hit_tokens = Counter(
            "tw_prefix_cache_hit_tokens", "prompt tokens served from the prefix cache", registry=r
        )
        self.finished = Counter("tw_requests_finished", "finished requests", ["reason"], registry=r)
        self.preemptions = Counter(
            "tw_preemptions", "sequences preempted for KV memory", registry=r
        )
        self.prefilled = Counter(
            "tw_prefill_tokens",
            "prompt tokens computed (not served by the prefix cache)",
            registry=r,
        )
        self.steps = Counter("tw_engine_steps", "engine steps (one forward pass each)", registry=r)
        self.busy = Counter(
            "tw_engine_busy_seconds", "time the engine spent in steps (utilization)", registry=r
        )
        self.spec_drafts = Counter(
            "tw_spec_verifications", "decode steps of a request that verified a draft", registry=r
        )
        self.spec_draft_tokens = Counter(
            "tw_spec_draft_tokens", "draft tokens proposed (n-gram or draft model)", registry=r
        )
        self.spec_accepted_tokens = Counter(
            "tw_spec_accepted_tokens",
            "draft tokens the model agreed with (acceptance rate: over tw_spec_draft_tokens; "
            "mean accepted length: over tw_spec_verifications)",
            registry=r,
        )
        self.running = Gauge("tw_requests_running", "sequences running in the engine", registry=r)
        self.waiting = Gauge("tw_requests_waiting", "sequences waiting in the engine", registry=r)
        self.kv_usage = Gauge("tw_kv_cache_usage_ratio", "share of KV blocks in use", registry=r)
        self.lag = Gauge(
            "tw_worker_consumer_lag", "batches not yet committed on assigned partitions", registry=r
        )

    def _faults(self, r: CollectorRegistry) -> None:
        """Failures, handled errors, unfollowed cancels and engine pauses."""
        self.failures = Counter(
            "tw_worker_request_failures",
            "requests ended with an error, by cause (each also dead-lettered)",
            ["code"],
            registry=r,
        )
        self.handled_errors = Counter(
            "tw_worker_handled_errors",
            "failures the worker caught and survived, by where they happened",
            ["where"],
            registry=r,
        )
        self.unfollowed = Counter(
            "tw_worker_unfollowed_cancels",
            "requests cancelled because no client followed their stream",
            registry=r,
        )
        self.engine_paused = Gauge(
            "tw_worker_engine_paused",
            "1 while the engine is paused because token events cannot be published",
            registry=r,
        )

    def ttft_buckets(self) -> tuple[list[float], list[int]]:
        """The time-to-first-token histogram as the heartbeat carries it: the finite upper
        bounds, and the cumulative count within each, then the total."""
        le: list[float] = []
        counts: list[int] = []
        for family in self.ttft.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    if bound != float("inf"):
                        le.append(bound)
                    counts.append(int(sample.value))
        return le, counts

    def started(self, req: GenerateRequest) -> None:
        self.queue_time.observe(max(0.0, time.time() - req.created_at))

    def published(self, req: GenerateRequest, ev: TokenEvent) -> None:
        now = time.time()
        last = self._last_event.get(ev.request_id)
        if ev.seq == 0 and not ev.error:
            self.ttft.observe(max(0.0, now - req.created_at))
        elif last is not None:
            self.itl.observe(now - last)
        self._last_event[ev.request_id] = now
        self.generation_tokens.inc(len(ev.token_ids))
        if ev.final:
            self._last_event.pop(ev.request_id, None)
            self.e2e.observe(max(0.0, now - req.created_at))
            self.finished.labels(
                reason=ev.finish_reason.value if ev.finish_reason else "error"
            ).inc()
            if ev.usage is not None:
                self.prompt_tokens.inc(ev.usage.prompt_tokens)
                self.prefix_hit_tokens.inc(ev.usage.cached_tokens)

    def refresh(self, stats: EngineStats, lag: int) -> None:
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.kv_usage.set(stats.kv_used_blocks / max(1, stats.kv_blocks))
        self.preemptions.inc(stats.preemptions - self._preempted_seen)
        self._preempted_seen = stats.preemptions
        self.prefilled.inc(stats.prefilled_tokens - self._prefilled_seen)
        self._prefilled_seen = stats.prefilled_tokens
        self.spec_drafts.inc(stats.spec_verifications - self._spec_seen[0])
        self.spec_draft_tokens.inc(stats.spec_draft_tokens - self._spec_seen[1])
        self.spec_accepted_tokens.inc(stats.spec_accepted_tokens - self._spec_seen[2])
        self._spec_seen = (
            stats.spec_verifications,
            stats.spec_draft_tokens,
            stats.spec_accepted_tokens,
        )
        self.steps.inc(stats.steps - self._steps_seen)
        self._steps_seen = stats.steps
        self.busy.inc(stats.step_seconds - self._busy_seen)
        self._busy_seen = stats.step_seconds
        self.lag.set(lag)
