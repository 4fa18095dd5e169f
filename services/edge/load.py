"""The batchers' queue depth, read in the background so admission never waits on it.

Batchers advertise ``BatcherStatus`` in the live-member registry (short-lived keys and an
index, no keyspace scan); the edge sums them every ``refresh_s`` and sheds load (503) while the total queue exceeds the limit, before
queues grow without bound. Workers' heartbeats, read at the same pace, give the served
model's context length to an edge that has no model folder.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shared import registry
from shared.codec import DecodeError, decode
from shared.messages import BatcherStatus, WorkerHeartbeat
from shared.names import Names
from shared.retry import REDIS_DOWN
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)

STATUS_TTL_S = 3.0  # batchers refresh their status several times within this


@dataclass(frozen=True, slots=True)
class Load:
    """The batchers' queue as the edge last read it: how many batchers, and what they hold."""

    batchers: int = 0
    queued_requests: int = 0
    queued_tokens: int = 0
    # The smallest context the live workers advertise (None: none advertises one).
    worker_context: int | None = None


class LoadWatcher:
    """Keeps ``current`` up to date with the sum of every live batcher's status."""

    def __init__(self, redis: aioredis.Redis, names: Names, refresh_s: float) -> None:
        self._redis = redis
        self._names = names
        self._refresh_s = refresh_s
        self.current = Load()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="edge-load")

    async def stop(self) -> None:
        # A cancel that lands as a Redis call completes is lost (see shared.tasks), and
        # the loop is inside one nearly all the time: the flag ends it at its next turn.
        self._stopping = True
        await cancel_and_wait(self._task)

    async def refresh(self) -> Load:
        n = self._names
        statuses = []
        for raw in await registry.read_live(
            self._redis, n.batchers_index, n.batcher_status, STATUS_TTL_S
        ):
            try:
                statuses.append(decode(BatcherStatus, raw))
            except DecodeError:
                continue
        self.current = Load(
            batchers=len(statuses),
            queued_requests=sum(s.queued_requests for s in statuses),
            queued_tokens=sum(s.queued_tokens for s in statuses),
            worker_context=await self._worker_context(),
        )
        return self.current

    async def _worker_context(self) -> int | None:
        n = self._names
        contexts = []
        for raw in await registry.read_live(
            self._redis, n.workers_index, n.heartbeat, STATUS_TTL_S
        ):
            try:
                hb = decode(WorkerHeartbeat, raw)
            except DecodeError:
                continue
            if hb.context_tokens > 0:
                contexts.append(hb.context_tokens)
        return min(contexts) if contexts else self.current.worker_context

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self.refresh()
            except REDIS_DOWN as exc:  # keep the last reading; the Redis probe logs outages
                log.debug("cannot read batcher status: %r", exc)
            except RedisError as exc:
                log.warning("cannot read batcher status: %r", exc)
            await asyncio.sleep(self._refresh_s)
