"""Everything one edge process holds for its lifetime, built once and passed explicitly."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from services.edge.auth import KeyStore, load_pepper, parse_key_list
from services.edge.beacon import EdgeBeacon
from services.edge.cache import ResponseCache, response_cache
from services.edge.config import EdgeSettings
from services.edge.dashboard import DashboardFeed
from services.edge.health import RedisHealth
from services.edge.hub import Hub
from services.edge.load import LoadWatcher
from services.edge.metrics import EdgeMetrics
from services.edge.model_info import ModelInfo
from services.edge.ratelimit import RateLimiter
from services.edge.relay import EventStream
from services.edge.shapes import fingerprint_of
from shared.kafka_io import KafkaProbe, RenewingProducer
from shared.names import Names
from shared.retry import Dependency
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def redis_client(settings: EdgeSettings) -> aioredis.Redis:
    """The edge's Redis client. Its pool waits for a free connection rather than failing
    (redis-py's default pool refuses the command past 100 in flight, which a busy edge
    reaches: each admission runs three at once), and it retries a dropped connection
    briefly, so a stale pooled connection after a Redis restart is not an error, while
    an outage still surfaces within about a second."""
    access = settings.redis
    retry = Retry(ExponentialWithJitterBackoff(cap=0.25, base=0.02), retries=2)
    timeouts = {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
    }
    if access.cluster:
        # RedisCluster keeps a pool per node, of the same size; past it a command is
        # refused (MaxConnectionsError, a 503 at the edge) rather than waiting.
        return access.client(
            max_connections=settings.redis_max_connections, retry=retry, **timeouts
        )
    pool = aioredis.BlockingConnectionPool.from_url(
        access.url,
        **access.kwargs(),
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_timeout_s,
        retry=retry,
        **timeouts,
    )
    return aioredis.Redis.from_pool(pool)


@dataclass
class EdgeState:
    """The edge's clients and helpers; ``start``/``stop`` pair their lifecycles."""

    settings: EdgeSettings
    redis: aioredis.Redis
    producer: RenewingProducer
    hub: Hub
    keys: KeyStore
    limiter: RateLimiter
    load: LoadWatcher
    model: ModelInfo
    metrics: EdgeMetrics
    health: RedisHealth
    # Whether Kafka answers: a gauge and a log line per outage for operators (a request
    # Kafka does not take in time is refused on its own, with 503 queue_unavailable).
    kafka: Dependency
    kafka_probe: KafkaProbe
    cache: ResponseCache
    beacon: EdgeBeacon
    dashboard: DashboardFeed
    _background: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def names(self) -> Names:
        return self.settings.names

    @cached_property
    def fingerprint(self) -> str:
        """The ``system_fingerprint`` of every response (from the model's identity)."""
        return fingerprint_of(self.cache.model)

    @classmethod
    def build(cls, settings: EdgeSettings, metrics: EdgeMetrics) -> EdgeState:
        redis = redis_client(settings)
        names = settings.names
        hub = Hub(settings.redis, name=f"tw-edge:{names.prefix}:{os.getpid()}")
        # Each request is sent alone and waited for: lingering would only add latency (the
        # batcher does the batching).
        producer = RenewingProducer(
            settings,
            client_id="edge",
            linger_ms=0,
            request_timeout_ms=settings.kafka_request_timeout_ms,
        )
        kafka = Dependency("kafka", log, metrics.dependencies)
        health = RedisHealth(redis, lambda: hub.connected, metrics)
        return cls(
            settings=settings,
            redis=redis,
            producer=producer,
            hub=hub,
            keys=KeyStore(
                redis,
                names,
                parse_key_list(settings.api_keys),
                required=settings.auth == "required",
                pepper=load_pepper(settings.key_pepper, settings.key_pepper_file),
            ),
            limiter=RateLimiter(
                redis, names, settings.rate_requests_per_min, settings.rate_tokens_per_min
            ),
            load=LoadWatcher(redis, names, settings.load_refresh_s),
            model=ModelInfo.load(settings.model_dir),
            metrics=metrics,
            health=health,
            kafka=kafka,
            kafka_probe=KafkaProbe(producer, [names.requests], kafka),
            cache=response_cache(settings, redis, metrics),
            beacon=EdgeBeacon(redis, settings, metrics, lambda: health.serving),
            dashboard=DashboardFeed(settings, redis),
        )

    async def start(self) -> None:
        await self.producer.start()
        self.kafka_probe.start()
        await self.hub.start()
        self.load.start()
        self.health.start()
        await self.cache.start()
        self.beacon.start()
        if self.settings.auth == "off":
            log.warning("TW_AUTH=off: calls without an API key are served as tenant 'default'")
        elif not self.keys.peppered:
            log.warning(
                "no TW_KEY_PEPPER or TW_KEY_PEPPER_FILE: keys made by 'tokenwire keys create' "
                "are refused; only TW_API_KEYS and older unpeppered keys authenticate"
            )

    async def stop(self) -> None:
        await self.beacon.stop()
        await self.dashboard.stop()
        await cancel_and_wait(*self._background)
        await self.health.stop()
        await self.load.stop()
        await self.hub.stop()
        await self.kafka_probe.stop()
        await self.producer.stop()
        await self.redis.aclose()

    def event_stream(self, request_id: str, *, after_seq: int) -> EventStream:
        """A stream of ``request_id``'s events after ``after_seq`` over this process's
        hub (open it before use); its log reads retry, counted, while Redis is away."""
        return EventStream(
            self.hub,
            self.redis,
            self.names,
            request_id,
            after_seq=after_seq,
            on_retry=self.metrics.redis_retries.labels("replay_log").inc,
        )

    def tracked_sizes(self) -> dict[str, int]:
        """Sizes of everything this process keeps per request. Rate buckets, owners and
        logs live in Redis with TTLs; in-process there are the hub's maps and the
        background tasks (cancels after a disconnect)."""
        return {**self.hub.sizes(), "background_tasks": len(self._background)}

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (e.g. a cancel after the client has gone)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task failed: %r", task.exception())
