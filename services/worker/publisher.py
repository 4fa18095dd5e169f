"""Token events out to Redis: each step's events for every stream in one pipelined write,
retried in order until Redis takes them (never dropped, never reordered), and who listens.

Every event is appended to its replay log before it is published; a retried write sends the
same commands again, which is safe: a re-appended log entry fails on its explicit id and
readers drop re-published events by ``seq``. While Redis is away the caller (the worker's
publishing task) waits here, the engine's outputs queue up behind it, and the engine is
paused when that queue is full (``EngineProcess`` flow control)."""

from __future__ import annotations

import logging
import time

from services.worker.events import RequestState
from shared import token_stream
from shared.messages import TokenEvent
from shared.names import Names
from shared.redis_client import RedisAccess
from shared.resp import RedisReplyError, RespWriter
from shared.retry import REDIS_DOWN, Dependency, transient_reply

log = logging.getLogger(__name__)


class EventPublisher:
    """Writes token events; ``publish`` returns once Redis has every one of them."""

    def __init__(
        self, redis_url: str | RedisAccess, names: Names, *, name: str, redis: Dependency
    ) -> None:
        self.names = names
        self.redis = redis
        self.conn = RespWriter(redis_url, name=name)

    async def publish(self, pairs: list[tuple[RequestState, TokenEvent]]) -> None:
        """Append and publish ``pairs``' events, waiting out a Redis outage; then note on
        each stream whether any client received its event."""
        if not pairs:
            return
        cmds = token_stream.event_commands(self.names, [ev for _, ev in pairs])
        replies = await self.redis.call(lambda: self._write(cmds), REDIS_DOWN)
        listeners = [r for c, r in zip(cmds, replies, strict=True) if c[0] == self.names.publish]
        now = time.monotonic()
        for (st, _), heard in zip(pairs, listeners, strict=True):
            st.heard(isinstance(heard, int) and heard > 0, now)
        for c, r in zip(cmds, replies, strict=True):
            if isinstance(r, RedisReplyError):
                # E.g. an event another worker logged first: readers drop it by seq.
                log.warning("redis: %s (%s)", r, c[1].decode(errors="replace"))

    async def _write(self, cmds: list[tuple[bytes, ...]]) -> list[object]:
        # Replicated: a cluster master lost right after must not take events with it, or
        # the promoted replica's replay logs would have gaps that no one writes again.
        replies = await self.conn.execute(cmds, replicated=True)
        if any(transient_reply(r) for r in replies):  # out of memory or loading: retry all
            raise ConnectionError(f"redis refused the write: {replies}")
        return replies

    async def aclose(self) -> None:
        await self.conn.aclose()
