"""One Redis pub/sub connection per edge process and Redis node, multiplexing every
request's channel. A single Redis is one node; on a Redis Cluster each channel is subscribed
on the master of its slot with sharded pub/sub (``SSUBSCRIBE``), so each shard relays only
its own requests' tokens.

Each stream registers a mailbox for its channel; a connection's reader task parses the socket
and drops each message's bytes into the mailboxes of its channel. Nothing per message but a
dict lookup and ``put_nowait``: redis-py's ``PubSub`` spends ~30 µs per message in retry and
observability wrappers, about as much as the rest of the relay, so the hub speaks RESP itself
(``shared.resp``).

When a connection is lost, or a node says a channel's slot is served elsewhere (a MOVED
reply, or the ``sunsubscribe`` it sends when the slot moves or its master is demoted), the
channel is placed again: the slots' owners are read again if need be, the channel is
subscribed on its node, and its mailboxes receive ``RESYNC`` once that node confirms:
what was published meanwhile is in the replay log, which the stream reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Final

from shared.redis_client import RedisAccess, as_access
from shared.resp import Addr, RedisReplyError, RespParser, Topology, command, connect, redirect
from shared.retry import TRANSIENT_REPLIES, backoff
from shared.tasks import cancel_and_wait

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


class _Link:
    """The pub/sub connection to one node, and the channels placed on it."""

    __slots__ = ("addr", "channels", "leaving", "pending", "task", "up", "writer")

    def __init__(self, addr: Addr) -> None:
        self.addr = addr
        self.writer: asyncio.StreamWriter | None = None
        self.up = False
        self.task: asyncio.Task[None] | None = None
        self.channels: set[bytes] = set()
        # Subscribes sent and not answered yet, oldest first, each with the ``_ready``
        # future it was sent for (a channel dropped and added again has a new one).
        self.pending: deque[tuple[bytes, asyncio.Future[None]]] = deque()
        self.leaving: dict[bytes, int] = {}  # unsubscribes sent and not answered yet

    def send(self, data: bytes) -> None:
        if self.up and self.writer is not None and not self.writer.is_closing():
            self.writer.write(data)  # while down, the next connection subscribes again

    def close(self) -> None:
        self.up = False
        if self.writer is not None:
            self.writer.close()
            self.writer = None


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
        self.name = name  # the connections' CLIENT name, as CLIENT LIST shows it
        self._access = as_access(redis_url)
        self._timeout = subscribe_timeout_s
        self.topology = Topology(self._access, name=f"{name}-topology")
        sharded = self._access.cluster
        self._subscribe_cmd = b"SSUBSCRIBE" if sharded else b"SUBSCRIBE"
        self._unsubscribe_cmd = b"SUNSUBSCRIBE" if sharded else b"UNSUBSCRIBE"
        self._kinds = (
            (b"smessage", b"ssubscribe", b"sunsubscribe")
            if sharded
            else (b"message", b"subscribe", b"unsubscribe")
        )
        self._sinks: dict[bytes, set[Mailbox]] = {}
        self._ready: dict[bytes, asyncio.Future[None]] = {}
        self._links: dict[Addr, _Link] = {}
        self._placed: dict[bytes, _Link] = {}
        self._unplaced: set[bytes] = set()  # channels waiting for a node
        self._resync: set[bytes] = set()  # channels to resync once subscribed again
        self._wake = asyncio.Event()  # channels wait to be placed
        self._mender: asyncio.Task[None] | None = None
        self._failures = 0  # connections lost or refused since one last succeeded
        self.reconnects = 0

    @property
    def connected(self) -> bool:
        """Every node serving a slot has its connection up, and no channel waits for one."""
        if self.topology.stale or self._unplaced:
            return False
        links = [self._links.get(addr) for addr in self.topology.masters]
        return bool(links) and all(k is not None and k.up for k in links)

    @property
    def channels(self) -> int:
        return len(self._sinks)

    def sizes(self) -> dict[str, int]:
        """Entries of each per-channel map: all should follow the open streams."""
        return {
            "hub_sinks": len(self._sinks),
            "hub_ready": len(self._ready),
            "hub_acks": sum(len(k.pending) for k in self._links.values()),
        }

    async def start(self) -> None:
        """Connect to every node serving a slot (raising if Redis does not answer) and
        start their reader tasks."""
        await self.topology.ensure(self._timeout)
        for addr in self.topology.masters:
            link = self._links[addr] = _Link(addr)
            reader = await self._connect(link)
            link.task = asyncio.create_task(self._serve(link, reader), name=f"edge-hub-{addr}")
        self._mender = asyncio.create_task(self._mend(), name="edge-hub-mender")

    async def stop(self) -> None:
        tasks = [k.task for k in list(self._links.values()) if k.task is not None]
        await cancel_and_wait(*tasks, self._mender)
        for link in list(self._links.values()):
            link.close()

    async def subscribe(self, channel: bytes, box: Mailbox) -> None:
        """Deliver ``channel``'s messages into ``box`` from the moment this returns."""
        sinks = self._sinks.get(channel)
        if sinks is None:
            sinks = self._sinks[channel] = set()
            self._ready[channel] = asyncio.get_running_loop().create_future()
            self._place(channel)
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
        if sinks:
            return
        del self._sinks[channel]
        self._ready.pop(channel, None)
        self._unplaced.discard(channel)
        self._resync.discard(channel)
        link = self._placed.pop(channel, None)
        if link is not None:
            link.channels.discard(channel)
            if link.up:
                link.leaving[channel] = link.leaving.get(channel, 0) + 1
                link.send(command(self._unsubscribe_cmd, channel))

    # --- placing channels on nodes -------------------------------------------------------
    def _place(self, channel: bytes) -> None:
        """Subscribe ``channel`` on its node's connection (opened if need be), or leave it
        to the mender while the slots' owners are not known."""
        if self.topology.stale:
            self._unplace(channel)
            return
        try:
            addr = self.topology.node_of(channel)
        except ConnectionError:  # its slot has no master yet
            self.topology.invalidate()
            self._unplace(channel)
            return
        link = self._links.get(addr) or self._open_link(addr)
        link.channels.add(channel)
        self._placed[channel] = link
        if link.up:
            self._send_subscribe(link, channel)

    def _open_link(self, addr: Addr) -> _Link:
        link = self._links[addr] = _Link(addr)
        link.task = asyncio.create_task(self._open(link), name=f"edge-hub-{addr}")
        return link

    def _unplace(self, channel: bytes) -> None:
        link = self._placed.pop(channel, None)
        if link is not None:
            link.channels.discard(channel)
        ready = self._ready.get(channel)
        if ready is not None and ready.done():
            self._resync.add(channel)  # events may go by before it is subscribed again
        self._unplaced.add(channel)
        self._wake.set()

    def _send_subscribe(self, link: _Link, channel: bytes) -> None:
        link.pending.append((channel, self._ready[channel]))
        link.send(command(self._subscribe_cmd, channel))

    async def _mend(self) -> None:
        """Place the channels that lost their node, reading the slots' owners again first
        (with backoff while no node answers, or while the new connections fail)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._failures:
                await asyncio.sleep(backoff(self._failures - 1))
            try:
                await self.topology.ensure(self._timeout)
            except (ConnectionError, OSError, TimeoutError) as exc:
                self._lost_try(exc)
                self._wake.set()
                continue
            channels, self._unplaced = self._unplaced, set()
            for channel in channels:
                if channel in self._sinks:
                    self._place(channel)
            for addr in self.topology.masters:  # a connection to each, channels or none
                if addr not in self._links:
                    self._open_link(addr)

    def _lost_try(self, exc: BaseException) -> None:
        # Once per outage: the edge's Redis probe reports the outage itself.
        level = logging.WARNING if self._failures == 0 else logging.DEBUG
        log.log(level, "pub/sub reconnect failed, retrying: %r", exc)
        self._failures += 1

    # --- connections ---------------------------------------------------------------------
    async def _connect(self, link: _Link) -> asyncio.StreamReader:
        reader, link.writer = await connect(
            self._access, name=self.name, timeout_s=self._timeout, addr=link.addr
        )
        link.up = True
        if self._failures:
            log.info("pub/sub reconnected after %d failed tries", self._failures)
            self._failures = 0
        for channel in link.channels:
            self._send_subscribe(link, channel)
        return reader

    async def _open(self, link: _Link) -> None:
        try:
            reader = await self._connect(link)
        except (OSError, TimeoutError, RedisReplyError) as exc:
            self._lost_try(exc)
            self._drop(link)
            return
        await self._serve(link, reader)

    async def _serve(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            await self._read(link, reader)
        except (OSError, asyncio.IncompleteReadError, RedisReplyError) as exc:
            log.warning("pub/sub connection to %s:%d lost: %s", *link.addr, exc)
        self.reconnects += 1
        self._drop(link)

    def _drop(self, link: _Link) -> None:
        """A connection lost or refused: its channels wait for a node again."""
        link.close()
        link.pending.clear()
        if self._links.get(link.addr) is link:
            del self._links[link.addr]
        self.topology.invalidate()
        for channel in list(link.channels):
            self._unplace(channel)
        self._wake.set()  # connect again, channels or none

    async def _read(self, link: _Link, reader: asyncio.StreamReader) -> None:
        parser = RespParser()
        sinks = self._sinks
        message, subscribed, unsubscribed = self._kinds
        while True:
            data = await reader.read(262_144)
            if not data:
                raise OSError("connection closed by Redis")
            for reply in parser.feed(data):
                if isinstance(reply, RedisReplyError):
                    self._refused(link, reply)
                    continue
                kind = reply[0]
                if kind == message:
                    for q in sinks.get(reply[1], ()):
                        q.put_nowait(reply[2])
                elif kind == subscribed:
                    self._acked(link, reply[1])
                elif kind == unsubscribed:
                    self._left(link, reply[1])

    def _acked(self, link: _Link, channel: bytes) -> None:
        """The node confirmed the oldest subscribe waiting: the channel's stream may read
        the log now (or again, after it was away)."""
        if not link.pending:
            return
        sent, fut = link.pending.popleft()
        if sent != channel or self._ready.get(channel) is not fut:
            return  # dropped (and maybe added again) since: a later confirmation is its
        if not fut.done():
            fut.set_result(None)
        self._failures = 0
        if channel in self._resync:
            self._resync.discard(channel)
            for q in self._sinks.get(channel, ()):
                q.put_nowait(RESYNC)

    def _refused(self, link: _Link, reply: RedisReplyError) -> None:
        """An error reply: pub/sub commands answer only a subscribe with one (an unsubscribe
        never fails), so it is the oldest waiting. A slot served elsewhere, or a cluster
        between masters: place the channel again. Anything else is not recoverable here."""
        if not link.pending or not (redirect(reply) or str(reply).startswith(TRANSIENT_REPLIES)):
            raise reply
        channel, fut = link.pending.popleft()
        if self._placed.get(channel) is link and self._ready.get(channel) is fut:
            self.topology.invalidate()
            self._failures += 1  # a cluster between masters: back off before asking again
            self._unplace(channel)

    def _left(self, link: _Link, channel: bytes) -> None:
        """An unsubscribe's answer, or a cluster node's own notice that it no longer serves
        the channel's slot: then the channel is placed again."""
        if link.leaving.get(channel):
            link.leaving[channel] -= 1
            if not link.leaving[channel]:
                del link.leaving[channel]
            return
        if self._placed.get(channel) is link:
            self.topology.invalidate()
            self._unplace(channel)
