"""One Redis pub/sub connection per edge process, multiplexing every request's channel.

Each stream registers a mailbox for its channel; the hub's reader task parses the socket and
drops each message's bytes into the mailboxes of its channel. Nothing per message but a dict
lookup and ``put_nowait``: redis-py's ``PubSub`` spends ~30 µs per message in retry and
observability wrappers, about as much as the rest of the relay, so the hub speaks RESP itself
(``shared.resp``).

After a reconnect every channel is subscribed again and its mailboxes receive ``RESYNC``: what
was published while the connection was down is in the replay log, which the stream reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from typing import Final

from shared.redis_client import RedisAccess
from shared.resp import RedisReplyError, RespParser, command, connect
from shared.retry import backoff

log = logging.getLogger(__name__)

RESYNC: Final = b""  # queued after a reconnect: read the replay log to fill the gap


class Mailbox:
    """One stream's inbox: messages appended by the hub, taken all at once by the stream.
    Lighter than ``asyncio.Queue`` (no per-item waiter bookkeeping) and woken with a plain
    timer rather than a timeout scope, since it sits on the per-event path."""

    __slots__ = ("_waiter", "items")

    def __init__(self) -> None:
        self.items: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, data: bytes) -> None:
        self.items.append(data)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> list[bytes]:
        out = list(self.items)
        self.items.clear()
        return out

    async def wait(self, deadline: float) -> bool:
        """Until something is in the box (True) or the loop time ``deadline`` (False)."""
        if self.items:
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return bool(self.items)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Hub:
    """The shared subscriber. ``subscribe`` returns once Redis confirms the subscription,
    so a reader that subscribes, then reads the log, cannot miss an event."""

    def __init__(
        self,
        redis_url: str | RedisAccess,
        *,
        name: str = "tw-edge",
        subscribe_timeout_s: float = 5.0,
    ) -> None:
        self.name = name  # the connection's CLIENT name, as CLIENT LIST shows it
        self._url = redis_url
        self._timeout = subscribe_timeout_s
        self._sinks: dict[bytes, set[Mailbox]] = {}
        self._ready: dict[bytes, asyncio.Future[None]] = {}
        self._acks: dict[bytes, deque[asyncio.Future[None]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.reconnects = 0

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def channels(self) -> int:
        return len(self._sinks)

    def sizes(self) -> dict[str, int]:
        """Entries of each per-channel map: all should follow the open streams."""
        return {
            "hub_sinks": len(self._sinks),
            "hub_ready": len(self._ready),
            "hub_acks": len(self._acks),
        }

    async def start(self) -> None:
        """Connect (raising if Redis does not answer) and start the reader task."""
        reader = await self._connect()
        self._task = asyncio.create_task(self._run(reader), name="edge-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._close_writer()

    async def subscribe(self, channel: bytes, box: Mailbox) -> None:
        """Deliver ``channel``'s messages into ``box`` from the moment this returns."""
        sinks = self._sinks.get(channel)
        if sinks is None:
            sinks = self._sinks[channel] = set()
            self._ready[channel] = self._send_subscribe(channel)
        sinks.add(box)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready[channel]), self._timeout)
        except BaseException:
            self.unsubscribe(channel, box)
            raise

    def unsubscribe(self, channel: bytes, box: Mailbox) -> None:
        """Stop delivering to ``box`` (synchronous, so it is safe in any ``finally``)."""
        sinks = self._sinks.get(channel)
        if sinks is None:
            return
        sinks.discard(box)
        if not sinks:
            del self._sinks[channel]
            self._ready.pop(channel, None)
            self._write(command(b"UNSUBSCRIBE", channel))

    # --- connection ----------------------------------------------------------------------
    def _send_subscribe(self, channel: bytes) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks.setdefault(channel, deque()).append(fut)
        self._write(command(b"SUBSCRIBE", channel))
        return fut

    def _write(self, data: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)  # while disconnected, the reconnect subscribes again

    async def _connect(self) -> asyncio.StreamReader:
        reader, self._writer = await connect(self._url, name=self.name, timeout_s=self._timeout)
        self._connected.set()
        return reader

    def _close_writer(self) -> None:
        self._connected.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def _run(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                await self._read(reader)
            except (OSError, asyncio.IncompleteReadError, RedisReplyError) as exc:
                log.warning("pub/sub connection lost: %s", exc)
            self._close_writer()
            reader = await self._reconnect()

    async def _reconnect(self) -> asyncio.StreamReader:
        failures = 0
        while True:
            try:
                reader = await self._connect()
                break
            except (OSError, TimeoutError, RedisReplyError) as exc:
                # Once per outage: the edge's Redis probe reports the outage itself.
                level = logging.WARNING if failures == 0 else logging.DEBUG
                log.log(level, "pub/sub reconnect failed, retrying: %r", exc)
                await asyncio.sleep(backoff(failures))
                failures += 1
        if failures:
            log.info("pub/sub reconnected after %d failed tries", failures)
        self.reconnects += 1
        self._acks.clear()
        for channel in self._sinks:
            old = self._ready[channel]
            fut = self._send_subscribe(channel)
            fut.add_done_callback(functools.partial(self._resync, channel, old))
            self._ready[channel] = fut
        return reader

    def _resync(self, channel: bytes, old: asyncio.Future[None], _: object = None) -> None:
        if not old.done():
            old.set_result(None)
        for q in self._sinks.get(channel, ()):
            q.put_nowait(RESYNC)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        parser = RespParser()
        sinks = self._sinks
        while True:
            data = await reader.read(262_144)
            if not data:
                raise OSError("connection closed by Redis")
            for reply in parser.feed(data):
                if isinstance(reply, RedisReplyError):
                    raise reply
                kind = reply[0]
                if kind == b"message":
                    for q in sinks.get(reply[1], ()):
                        q.put_nowait(reply[2])
                elif kind == b"subscribe":
                    self._acked(reply[1])

    def _acked(self, channel: bytes) -> None:
        """Redis confirmed a SUBSCRIBE: resolve the oldest one waiting for ``channel``.
        The entry goes when none waits, so the map holds only subscriptions in flight."""
        acks = self._acks.get(channel)
        if not acks:
            return
        fut = acks.popleft()
        if not acks:
            del self._acks[channel]
        if not fut.done():
            fut.set_result(None)
