"""A request's token events, exactly once each and in ``seq`` order.

Live events come from the process's shared subscriber (``Hub``); whatever was published
before the subscription, or lost in a reconnect, comes from the replay log. Events are
handed on as ``orjson``-decoded dicts: they come from our own workers, and building a
pydantic model per token would cost more than the rest of the relay.

A stream outlives a Redis outage: while the log cannot be read it stays behind, tries
again with capped backoff, and the relay keeps its client with keep-alives meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis

from services.edge.hub import RESYNC, Hub, Mailbox
from shared import token_stream
from shared.names import Names
from shared.retry import REDIS_DOWN, backoff

log = logging.getLogger(__name__)

Event = dict[str, Any]


class EventStream:
    """Subscribe first, then read the log from the last seq the client has, drop
    duplicates. Use as ``async with``; ``next()`` returns the next events in order."""

    def __init__(
        self,
        hub: Hub,
        redis: aioredis.Redis,
        names: Names,
        request_id: str,
        *,
        after_seq: int,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        self.request_id = request_id
        self.next_seq = after_seq + 1
        self.finished = False
        self.final_event: Event | None = None
        self._hub = hub
        self._redis = redis
        self._names = names
        self._channel = names.token_channel(request_id).encode()
        self._box = Mailbox()
        self._ready: list[Event] = []
        self._subscribed = False
        self._behind = False  # the log holds events not yet taken (a gap, a reconnect)
        self._failures = 0  # consecutive failed log reads
        self._on_retry = on_retry

    async def open(self) -> EventStream:
        """Subscribe; then read what the log already holds. Raises if Redis is away
        (``REDIS_DOWN``): a stream not yet open has no client to keep waiting."""
        await self._hub.subscribe(self._channel, self._box)
        self._subscribed = True
        try:
            await self._replay(include_last_seen=True)
        except BaseException:
            self.close()  # ``async with`` does not exit what failed to enter
            raise
        return self

    def complete(self, events: list[Event]) -> bool:
        """Take ``events`` as the stream's, from ``next_seq`` on (a cache hit's, written to
        the log in the same round trip): True when they reach the final event, and the
        stream is then read from them, never subscribing or reading the log. False when
        they stop short: ``open`` it to follow the rest."""
        for ev in events:
            if ev["seq"] == self.next_seq and not self.finished:
                self._take(ev, self._ready)
        return self.finished

    def unfinished(self) -> list[str]:
        """The request id while the stream has not finished (what a disconnect cancels)."""
        return [] if self.finished else [self.request_id]

    def close(self) -> None:
        if self._subscribed:
            self._subscribed = False
            self._hub.unsubscribe(self._channel, self._box)

    async def __aenter__(self) -> EventStream:
        return await self.open()

    async def __aexit__(self, *_: object) -> None:
        self.close()

    async def next(self, wait_s: float) -> list[Event]:
        """The next events (one or more, the final one last), or ``[]`` when none came
        within ``wait_s`` seconds or the stream has finished."""
        if self._ready:
            out, self._ready = self._ready, []
            return out
        if self.finished:
            return []
        deadline = asyncio.get_running_loop().time() + wait_s
        if self._behind:
            out = await self._catch_up(deadline)
            if out or self._behind:
                return out
        while await self._box.wait(deadline):
            out = await self._accept(self._box.take(), deadline)
            if out:
                return out
        return []

    async def _accept(self, raws: list[bytes], deadline: float) -> list[Event]:
        """Keep the contiguous new events of ``raws``; fill gaps from the log."""
        out: list[Event] = []
        for raw in raws:
            if raw != RESYNC:
                ev = orjson.loads(raw)
                seq = ev["seq"]
                if self.finished or seq < self.next_seq:
                    continue
                if seq == self.next_seq:
                    self._take(ev, out)
                    continue
            if not self.finished:
                # A gap (events went out before we subscribed) or a reconnect (RESYNC):
                # the log has what was missed, since it is written before publishing.
                self._behind = True
                out += await self._catch_up(deadline)
        return out

    async def _catch_up(self, deadline: float) -> list[Event]:
        """The log's events from ``next_seq`` on. While Redis is away, tries again with
        capped backoff until the loop time ``deadline`` (at least once), then returns
        ``[]`` still behind: the next call goes on trying."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._replay()
            except REDIS_DOWN as exc:
                pause = backoff(self._failures)
                self._failures += 1
                if self._on_retry is not None:
                    self._on_retry()
                log.debug("replay log unreadable: %r", exc, extra={"request_id": self.request_id})
                if loop.time() + pause > deadline:
                    return []
                await asyncio.sleep(pause)
                continue
            self._behind = False
            self._failures = 0
            out, self._ready = self._ready, []
            return out

    def _take(self, ev: Event, out: list[Event]) -> None:
        self.next_seq += 1
        out.append(ev)
        if ev.get("finish_reason") is not None:
            self.finished = True
            self.final_event = ev

    async def _replay(self, *, include_last_seen: bool = False) -> None:
        """Move the log's events from ``next_seq`` on into the ready list. With
        ``include_last_seen`` the event just before is read too, to learn whether the
        stream had already ended there (a client resuming after the final event)."""
        start = self.next_seq - 1 if include_last_seen and self.next_seq > 0 else self.next_seq
        raws = await token_stream.read_log_raw(
            self._redis, self._names, self.request_id, from_seq=start
        )
        for raw in raws:
            ev = orjson.loads(raw)
            if ev["seq"] == self.next_seq - 1 and ev.get("finish_reason") is not None:
                self.finished = True
                self.final_event = ev
            if ev["seq"] == self.next_seq and not self.finished:
                self._take(ev, self._ready)
