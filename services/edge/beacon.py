"""The edge's heartbeat: its address and traffic, refreshed in Redis every second under a
key with a TTL and in the edges' index, as workers and batchers advertise themselves.
``tokenwire status`` and the dashboard show each edge from it, and an edge whose key
expired as silent; nothing routes on it. Withdrawn on a clean stop."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.edge.config import EdgeSettings
from services.edge.metrics import EdgeMetrics
from shared import registry
from shared.codec import encode
from shared.messages import EdgeHeartbeat
from shared.retry import REDIS_DOWN
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
TTL_S = 3.0  # three beats: one late beat is not a dead edge

_ANY_ADDRESS = ("", "0.0.0.0", "::")


def edge_id() -> str:
    """This process's id: host name and process id, as batchers name themselves."""
    return f"edge-{socket.gethostname()}-{os.getpid()}"


def address_of(settings: EdgeSettings) -> str:
    """Where this edge serves, as configured (the host name where it listens on every
    address)."""
    host = socket.gethostname() if settings.host in _ANY_ADDRESS else settings.host
    return f"http://{host}:{settings.port}"


class EdgeBeacon:
    """Publishes this edge's ``EdgeHeartbeat`` every ``INTERVAL_S`` while it runs; waits
    out a Redis outage (the next beat after it is back advertises the edge again)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: EdgeSettings,
        metrics: EdgeMetrics,
        serving: Callable[[], bool],
    ) -> None:
        self._redis = redis
        self._settings = settings
        self._metrics = metrics
        self._serving = serving
        self.edge_id = edge_id()
        self._address = address_of(settings)
        self._started_at = time.time()
        self._task: asyncio.Task[None] | None = None

    def heartbeat(self) -> EdgeHeartbeat:
        """What this edge advertises now."""
        totals = self._metrics.totals()
        return EdgeHeartbeat(
            edge_id=self.edge_id,
            ttl_s=TTL_S,
            address=self._address,
            started_at=self._started_at,
            open_streams=int(totals["streams"]),
            requests=int(totals["requests"]),
            submitted=int(totals["submitted"]),
            rejected=int(totals["rejected"]),
            serving=self._serving(),
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="edge-beacon")

    async def stop(self) -> None:
        """Stop beating and withdraw the heartbeat (best effort: Redis may be away)."""
        await cancel_and_wait(self._task)
        names = self._settings.names
        pipe = self._redis.pipeline(transaction=False)
        registry.withdraw(pipe, names.edges_index, self.edge_id, names.edge_heartbeat(self.edge_id))
        try:
            await asyncio.wait_for(pipe.execute(), TTL_S)
        except REDIS_DOWN as exc:  # its key expires on its own
            log.info("edge heartbeat not withdrawn: %r", exc)

    async def beat(self) -> None:
        names = self._settings.names
        pipe = self._redis.pipeline(transaction=False)
        key = names.edge_heartbeat(self.edge_id)
        registry.advertise(
            pipe, names.edges_index, self.edge_id, key, encode(self.heartbeat()), TTL_S
        )
        await pipe.execute()

    async def _run(self) -> None:
        while True:
            try:
                await self.beat()
            except REDIS_DOWN as exc:  # the Redis probe reports the outage
                log.debug("edge heartbeat not published: %r", exc)
            except RedisError as exc:  # e.g. an ACL without the edges' keys: say so, go on
                log.warning("edge heartbeat refused by Redis: %r", exc)
            await asyncio.sleep(INTERVAL_S)
