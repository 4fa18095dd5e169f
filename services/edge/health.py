"""Whether Redis answers, as this edge last saw it: a probe, a gauge, one log line per
outage, and the 503 that new requests get meanwhile.

Running streams wait it out (the hub reconnects, the streams read the replay log once it
is back); a new request cannot be followed or cancelled without Redis, so admission
refuses it with 503 and ``Retry-After`` until the probe and the shared subscriber are
back. Every Redis call on the admission path runs inside ``guard``, which turns an outage
met there into the same 503 rather than a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

import redis.asyncio as aioredis

from services.edge.errors import ApiError, unavailable
from services.edge.metrics import EdgeMetrics
from shared.retry import REDIS_DOWN
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2.0  # a probe interval and the subscriber's longest reconnect pause


class RedisHealth:
    """Probes Redis every ``probe_s``; ``serving`` while it answers and the shared
    subscriber (``subscribed()``) is connected."""

    def __init__(
        self,
        redis: aioredis.Redis,
        subscribed: Callable[[], bool],
        metrics: EdgeMetrics,
        *,
        probe_s: float = 1.0,
        timeout_s: float = 1.0,
    ) -> None:
        self._redis = redis
        self._subscribed = subscribed
        self._metrics = metrics
        self._probe_s = probe_s
        self._timeout_s = timeout_s
        self._down_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        metrics.redis_up.set(1)

    @property
    def serving(self) -> bool:
        return self._down_since is None and self._subscribed()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="edge-redis-probe")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def probe(self) -> bool:
        """Ping Redis once; True when it answered."""
        try:
            await asyncio.wait_for(self._redis.ping(), self._timeout_s)
        except REDIS_DOWN as exc:
            self._lost(exc)
            return False
        self._back()
        return True

    def check(self, request_id: str | None = None) -> None:
        """Raise the 503 now if Redis is known to be away (before anything is queued)."""
        if not self.serving:
            raise self.refusal("admission", request_id, None)

    @contextlib.contextmanager
    def guard(self, what: str, request_id: str | None = None) -> Iterator[None]:
        """Turn an outage met inside the block into the 503 (``what``: the call, for the
        debug log and the metric)."""
        try:
            yield
        except REDIS_DOWN as exc:
            raise self.refusal(what, request_id, exc) from None

    def refusal(self, what: str, request_id: str | None, exc: BaseException | None) -> ApiError:
        """The 503 for a request refused because Redis is away, counted and logged."""
        self._metrics.rejected.labels("redis_unavailable").inc()
        log.debug("refused, Redis away (%s): %r", what, exc, extra={"request_id": request_id})
        return unavailable(
            "the token stream store is not reachable; retry after the time in Retry-After",
            code="stream_unavailable",
            retry_after_s=RETRY_AFTER_S,
        )

    async def _run(self) -> None:
        while True:
            await self.probe()
            await asyncio.sleep(self._probe_s)

    def _lost(self, exc: BaseException) -> None:
        if self._down_since is not None:
            return
        self._down_since = asyncio.get_running_loop().time()
        self._metrics.redis_up.set(0)
        log.warning("Redis unreachable (%r): new requests get 503 until it answers", exc)

    def _back(self) -> None:
        if self._down_since is None:
            return
        away = asyncio.get_running_loop().time() - self._down_since
        self._down_since = None
        self._metrics.redis_up.set(1)
        log.info("Redis reachable again after %.1f s", away)
