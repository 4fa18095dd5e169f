"""The batcher's view of Redis and Kafka, either of which may go away at any time.

A dependency that failed is not tried again until its backoff delay has passed, and a
Redis call made before then fails at once with ``RedisAway``: a tick never waits on a dead
server. The batcher goes on consuming, expiring and dead-lettering through Kafka while
Redis is away, and holds what needs Redis (dispatch, which needs the worker view; error
events) until it answers again. Kafka errors worth riding out are told apart from bugs."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
from aiokafka.errors import KafkaError
from prometheus_client import Counter
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from shared.kafka_io import REFUSED_FOR_GOOD, ridden_out
from shared.redis_client import RedisAccess, as_access
from shared.retry import REDIS_DOWN, Dependency, DependencyMetrics

T = TypeVar("T")

log = logging.getLogger(__name__)

# Each call is a few small commands: a server that takes longer is treated as away. The
# client's own retries are off (redis-py retries 3 times over seconds by default): the
# gate's backoff decides when to try again, without holding up the tick.
SOCKET_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0


class Gate:
    """A dependency with the time of its next try: closed from a failure until the backoff
    delay has passed, open again (and reported back) on the first success."""

    def __init__(self, dependency: Dependency) -> None:
        self.dependency = dependency
        self._retry_at = 0.0

    @property
    def up(self) -> bool:
        return self.dependency.up

    def open(self) -> bool:
        """Whether a call may be tried now."""
        return self.up or time.monotonic() >= self._retry_at

    def failed(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + self.dependency.failed(exc)

    def answered(self, asked_at: float | None = None) -> None:
        self.dependency.answered(asked_at)


class RedisAway(Exception):
    """Redis did not answer, or is not to be tried again yet."""


class RedisLink:
    """A Redis client behind a gate: ``call`` runs an operation if Redis may be tried now
    and records the outcome (log lines, gauge, outage counter)."""

    def __init__(self, access: str | RedisAccess, metrics: DependencyMetrics) -> None:
        self.client: aioredis.Redis = as_access(access).client(
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
        self.gate = Gate(Dependency("redis", log, metrics))

    @property
    def up(self) -> bool:
        return self.gate.up

    async def call(self, op: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """``await op(client)``, or ``RedisAway`` if Redis is away (now or still)."""
        if not self.gate.open():
            raise RedisAway
        asked_at = time.monotonic()
        try:
            result = await op(self.client)
        except REDIS_DOWN as exc:
            self.gate.failed(exc)
            raise RedisAway from exc
        self.gate.answered(asked_at)
        return result

    async def aclose(self) -> None:
        await self.client.aclose()


def kafka_failed(gate: Gate, exc: KafkaError) -> None:
    """Close Kafka's gate after a failed call, unless Kafka answered it: a producer
    refused for good is replaced, and Kafka itself is there."""
    if not isinstance(exc, REFUSED_FOR_GOOD):
        gate.failed(exc)


def note_kafka_error(
    counter: Counter, op: str, exc: KafkaError, request_id: str | None = None
) -> None:
    """Log and count a Kafka error that is to be ridden out (``op`` failed and will be
    tried again); re-raise any other."""
    if not ridden_out(exc):
        raise exc
    counter.labels(op=op, error=type(exc).__name__).inc()
    log.warning("Kafka %s failed, will retry: %r", op, exc, extra={"request_id": request_id})
