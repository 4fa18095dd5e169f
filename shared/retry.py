"""Riding out a dependency (Redis, Kafka) that went away: capped exponential backoff with
jitter, and one record per dependency of whether it answers (a log line when it goes and
when it comes back, a gauge, an outage counter) — never a reason to exit."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.exceptions as redis_errors
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError
from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.resp import RedisReplyError

T = TypeVar("T")

# What a Redis that is restarting, unreachable or out of memory (maxmemory with
# noeviction) raises: transient, retried. Other error replies are bugs and propagate.
REDIS_DOWN: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    redis_errors.OutOfMemoryError,
    # A cluster between a master's loss and its replica's promotion, or moving a slot.
    redis_errors.ClusterDownError,  # MasterDownError among them
    redis_errors.TryAgainError,
    redis_errors.SlotNotCoveredError,
    redis_errors.ClusterError,  # RedisCluster gave up on a command's retries
    OSError,  # ConnectionError and TimeoutError among them
)
KAFKA_DOWN: tuple[type[BaseException], ...] = (
    KafkaConnectionError,
    KafkaTimeoutError,
    NodeNotReadyError,
)


def transient_reply(reply: object) -> bool:
    """Whether a raw RESP error reply says Redis is out of memory or still loading, or a
    cluster is between owners of a slot (a failover, a slot moving)."""
    return isinstance(reply, RedisReplyError) and str(reply).startswith(TRANSIENT_REPLIES)


TRANSIENT_REPLIES = ("OOM", "LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN")


def backoff(failures: int, *, first_s: float = 0.05, cap_s: float = 2.0) -> float:
    """Seconds to wait after ``failures`` failed tries (0: the first): doubling from
    ``first_s`` up to ``cap_s``, each drawn from its upper half so that many clients that
    lost one server do not retry in step."""
    ceiling = min(cap_s, first_s * 2 ** min(failures, 30))
    return random.uniform(ceiling / 2, ceiling)


class Backoff:
    """Capped exponential backoff with jitter: delay ``n`` is uniform in ``[c/2, c]`` for
    ``c = min(cap, first * 2**n)`` (no retry storm when many clients lose one server)."""

    def __init__(self, first_s: float = 0.05, cap_s: float = 2.0) -> None:
        self.first_s, self.cap_s = first_s, cap_s
        self.attempt = 0

    def next_delay(self) -> float:
        delay = backoff(self.attempt, first_s=self.first_s, cap_s=self.cap_s)
        self.attempt = min(self.attempt + 1, 30)
        return delay

    def reset(self) -> None:
        self.attempt = 0


class DependencyMetrics:
    """One gauge (1: answers) and one outage counter per service, labelled by dependency."""

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        self.up = Gauge(
            f"tw_{service}_dependency_up",
            "1 while the dependency answers, 0 during an outage",
            ["dependency"],
            registry=registry,
        )
        self.outages = Counter(
            f"tw_{service}_dependency_outages",
            "outages of a dependency ridden out",
            ["dependency"],
            registry=registry,
        )


class Dependency:
    """Whether one dependency answers, as its callers last found it."""

    def __init__(
        self, name: str, log: logging.Logger, metrics: DependencyMetrics | None = None
    ) -> None:
        self.name = name
        self._log = log
        self._metrics = metrics
        self.down_since: float | None = None
        self.backoff = Backoff()
        if metrics is not None:
            metrics.up.labels(name).set(1)

    @property
    def up(self) -> bool:
        return self.down_since is None

    def failed(self, exc: BaseException) -> float:
        """Record a failed call; returns how long to wait before the next try."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            self._log.warning("%s is unreachable (%r): retrying with backoff", self.name, exc)
            if self._metrics is not None:
                self._metrics.up.labels(self.name).set(0)
                self._metrics.outages.labels(self.name).inc()
        return self.backoff.next_delay()

    def answered(self, asked_at: float | None = None) -> None:
        """Record an answer; ``asked_at`` (``time.monotonic()``) is when its call was made. A
        call made before the outage was found (a send in flight as a broker shut down)
        says nothing about now: its answer does not end the outage."""
        if asked_at is not None and self.down_since is not None and asked_at < self.down_since:
            return
        if self.down_since is not None:
            self._log.info("%s is back after %.1f s", self.name, time.monotonic() - self.down_since)
            self.down_since = None
            if self._metrics is not None:
                self._metrics.up.labels(self.name).set(1)
        self.backoff.reset()

    async def call(
        self,
        fn: Callable[[], Awaitable[T]],
        errors: tuple[type[BaseException], ...],
    ) -> T:
        """``await fn()`` until it does not raise one of ``errors``, backing off between
        tries. Cancellation (a stopping service) ends the wait."""
        while True:
            asked_at = time.monotonic()
            try:
                result = await fn()
            except errors as exc:
                await asyncio.sleep(self.failed(exc))
                continue
            self.answered(asked_at)
            return result
