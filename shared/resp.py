"""Redis's wire protocol (RESP2) for the hot paths that bypass redis-py: the edge's pub/sub
hub, and the worker's token-event writes and per-request claims. On a Redis Cluster
(``TW_REDIS_CLUSTER``) they send each command to the master of its key's slot
(``Topology``), as redis-py's ``RedisCluster`` does for the other paths.

redis-py is used everywhere else. On these two paths its per-command and per-message work
(argument encoding, retry and observability wrappers, an ``await`` per reply) was most of
the cost: a pipeline of one decode step's 24 token events (48 commands) took 0.78 ms of CPU
through redis-py and 0.17 ms packed here, with replies parsed by hiredis's C reader.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.connection import parse_url
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from shared.redis_client import RedisAccess, as_access

Addr = tuple[str, int]  # a Redis node: host, port


class RedisReplyError(Exception):
    """An error reply from Redis."""


def command(*parts: bytes) -> bytes:
    """A RESP2 command."""
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


class RespParser:
    """Incremental parser of RESP2 replies (hiredis's C reader). Error replies come back
    as ``RedisReplyError`` values, not raised."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader(replyError=RedisReplyError)

    def feed(self, data: bytes) -> list[Any]:
        """Add bytes; return every complete reply now available."""
        self._reader.feed(data)
        out: list[Any] = []
        while (reply := self._reader.gets()) is not False:
            out.append(reply)
        return out


async def connect(
    redis: str | RedisAccess,
    *,
    name: str,
    timeout_s: float,
    addr: Addr | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to Redis (a URL, or access with an ACL user and TLS; ``addr``: another
    node of its cluster than the URL's), authenticated, named (for ``CLIENT LIST``) and on
    the URL's database. Raises ``OSError``, ``TimeoutError`` or ``RedisReplyError``."""
    access = as_access(redis)
    u = parse_url(access.url)
    host, port = addr or (u.get("host", "127.0.0.1"), u.get("port", 6379))
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=access.ssl_context()), timeout_s
    )
    hello = []
    user, password = access.login()
    if password:
        auth = [user.encode()] if user else []
        hello.append(command(b"AUTH", *auth, password.encode()))
    # A connection name may not hold spaces or control characters.
    hello.append(command(b"CLIENT", b"SETNAME", re.sub(r"[^!-~]", "_", name).encode()))
    if u.get("db") and not access.cluster:  # a cluster has database 0 only
        hello.append(command(b"SELECT", str(u["db"]).encode()))
    for cmd in hello:
        writer.write(cmd)
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        if not line.startswith(b"+"):
            writer.close()
            raise RedisReplyError(line.decode(errors="replace").strip())
    return reader, writer


def key_of(parts: Sequence[bytes]) -> bytes | None:
    """The key a command is routed by: a script's first key, else its first argument
    (None for a command with neither)."""
    name = parts[0].upper()
    if name in (b"EVAL", b"EVALSHA", b"FCALL"):
        return parts[3] if len(parts) > 3 and int(parts[2]) > 0 else None
    return parts[1] if len(parts) > 1 else None


def redirect(reply: object) -> tuple[str, Addr] | None:
    """``("MOVED" | "ASK", node)`` when ``reply`` sends its command to another node."""
    if not isinstance(reply, RedisReplyError):
        return None
    words = str(reply).split()
    if len(words) != 3 or words[0] not in ("MOVED", "ASK"):
        return None
    host, _, port = words[2].rpartition(":")
    return words[0], (host, int(port))


class Topology:
    """Which node serves a key. A single Redis: the URL's, for every key. A cluster: the
    master of the key's slot, from ``CLUSTER SLOTS`` asked of any node that answers (the
    URL's first, then every node seen before), asked again once ``invalidate`` says the
    map is out of date (a MOVED reply, a lost node)."""

    def __init__(self, redis: str | RedisAccess, *, name: str = "tw-topology") -> None:
        self.access = as_access(redis)
        self.cluster = self.access.cluster
        u = parse_url(self.access.url)
        self.seed: Addr = (u.get("host", "127.0.0.1"), int(u.get("port", 6379)))
        self.name = name
        self._slots: list[Addr | None] = []
        self._nodes: list[Addr] = [self.seed]
        self._replicas: dict[Addr, int] = {}
        self._lock = asyncio.Lock()
        self.stale = self.cluster
        self.refreshes = 0

    @property
    def masters(self) -> list[Addr]:
        """Every node serving a slot (the URL's node on a single Redis)."""
        if not self.cluster:
            return [self.seed]
        return list(dict.fromkeys(a for a in self._slots if a is not None))

    def node_of(self, key: bytes | None) -> Addr:
        """The node to send a command on ``key`` to; raises ``ConnectionError`` while the
        key's slot has no master (call ``refresh`` first when ``stale``)."""
        if not self.cluster:
            return self.seed
        if key is None:
            masters = self.masters
            if not masters:
                raise ConnectionError("no node of the Redis Cluster is known to serve a slot")
            return masters[0]
        addr = self._slots[key_slot(key)] if self._slots else None
        if addr is None:
            raise ConnectionError(f"slot {key_slot(key)} has no master in the Redis Cluster")
        return addr

    def replicas_of(self, addr: Addr) -> int:
        """How many replicas the master ``addr`` had when the slots were last read."""
        return self._replicas.get(addr, 0)

    def invalidate(self) -> None:
        if self.cluster:
            self.stale = True

    async def ensure(self, timeout_s: float) -> None:
        """Read the slots' owners again if ``invalidate`` was called since the last read."""
        if self.stale:
            await self.refresh(timeout_s)

    async def refresh(self, timeout_s: float) -> None:
        """Read the slots' owners; ``ConnectionError`` when no known node answers."""
        async with self._lock:
            if not self.stale:
                return  # another caller read them while this one waited
            errors: list[str] = []
            for addr in dict.fromkeys([self.seed, *self.masters, *self._nodes]):
                try:
                    reply = await self._ask(addr, timeout_s)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                    errors.append(f"{addr[0]}:{addr[1]}: {exc!r}")
                    continue
                if isinstance(reply, RedisReplyError):
                    errors.append(f"{addr[0]}:{addr[1]}: {reply}")
                    continue
                self._read_slots(reply, addr)
                self.stale = False
                self.refreshes += 1
                return
            raise ConnectionError("no node of the Redis Cluster answered: " + "; ".join(errors))

    async def _ask(self, addr: Addr, timeout_s: float) -> Any:
        reader, writer = await connect(self.access, name=self.name, timeout_s=timeout_s, addr=addr)
        try:
            writer.write(command(b"CLUSTER", b"SLOTS"))
            parser = RespParser()
            while True:
                data = await asyncio.wait_for(reader.read(262_144), timeout_s)
                if not data:
                    raise ConnectionResetError("connection closed by Redis")
                if replies := parser.feed(data):
                    return replies[0]
        finally:
            writer.close()

    def _read_slots(self, reply: list[Any], asked: Addr) -> None:
        slots: list[Addr | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        nodes: list[Addr] = []
        replicas_of: dict[Addr, int] = {}
        for first, last, master, *replicas in reply:
            for node in (master, *replicas):
                # An empty host means the node that was asked.
                nodes.append((node[0].decode() or asked[0], int(node[1])))
            addr = (master[0].decode() or asked[0], int(master[1]))
            slots[first : last + 1] = [addr] * (last + 1 - first)
            replicas_of[addr] = len(replicas)
        self._slots = slots
        self._replicas = replicas_of
        self._nodes = list(dict.fromkeys([*nodes, *self._nodes]))


_LOST = (OSError, TimeoutError, asyncio.IncompleteReadError)  # a connection that failed
# How long a replicated write waits for a replica to have it: past this the master's answer
# stands alone (a replica that slow or gone is counted again at the next slot read).
REPLICA_WAIT_MS = 200


class _Node:
    """One pipelined connection to one node."""

    __slots__ = ("addr", "parser", "reader", "writer")

    def __init__(self, addr: Addr) -> None:
        self.addr = addr
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.parser = RespParser()

    async def run(self, packed: list[bytes]) -> list[Any]:
        assert self.reader is not None and self.writer is not None
        self.writer.write(b"".join(packed))
        out: list[Any] = []
        while len(out) < len(packed):
            data = await self.reader.read(262_144)
            if not data:
                raise ConnectionResetError("connection closed by Redis")
            out += self.parser.feed(data)
        return out

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class RespWriter:
    """Connections of its own for pipelined writes on a hot path: the commands go out in
    one write per node and their replies are read back together, in the commands' order.

    Batches are sent one at a time. A lost connection is opened again and what it had not
    answered sent again (up to ``attempts`` times, then ``ConnectionError``); on a cluster
    a command redirected (MOVED, ASK) is sent again to the node named. So callers may only
    send commands that are safe to repeat — as token events are (a re-appended log entry
    fails on its explicit id and readers drop re-published events by ``seq``), and the
    worker's claims (a claim it already holds reads back as its own)."""

    def __init__(
        self,
        redis: str | RedisAccess,
        *,
        name: str,
        timeout_s: float = 5.0,
        attempts: int = 3,
    ) -> None:
        self._access = as_access(redis)
        self.name = name
        self._timeout = timeout_s
        self._attempts = attempts
        self._lock = asyncio.Lock()
        self.topology = Topology(self._access, name=f"{name}-topology")
        self._nodes: dict[Addr, _Node] = {}
        self.reconnects = 0

    async def execute(
        self, commands: Sequence[Sequence[bytes]], *, replicated: bool = False
    ) -> list[Any]:
        """Send ``commands`` (each its parts: name, then arguments); their replies in order
        (errors as ``RedisReplyError`` values).

        ``replicated``: on a cluster, return only once a replica of each master written to
        has the writes too (``WAIT``, up to ``REPLICA_WAIT_MS``), so a master lost right
        after cannot take acknowledged writes with it: replication is asynchronous, and
        its replica, promoted, would lack them. A master with no replica (its own was lost)
        is not waited for."""
        if not commands:
            return []
        replies: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        asking: dict[int, Addr] = {}  # ASK: sent once to that node, after ASKING
        async with self._lock:
            for attempt in range(self._attempts):
                try:
                    async with asyncio.timeout(self._timeout):
                        todo, failure = await self._round(
                            commands, todo, asking, replies, replicated
                        )
                except _LOST as exc:
                    failure = exc  # the whole round: send all of it again
                if failure is None:
                    if not todo:
                        return replies
                    continue  # redirected: at once, to the node named
                self.topology.invalidate()
                if attempt == self._attempts - 1:
                    raise ConnectionError(f"redis: {failure!r}") from failure
                self.reconnects += 1
                await asyncio.sleep(0.05 * 2**attempt)
        raise ConnectionError(f"redis: {len(todo)} command(s) still redirected")

    async def _round(
        self,
        commands: Sequence[Sequence[bytes]],
        todo: list[int],
        asking: dict[int, Addr],
        replies: list[Any],
        replicated: bool,
    ) -> tuple[list[int], BaseException | None]:
        """Send the commands ``todo`` names and fill ``replies``; return those to send
        again (redirected, or sent on a connection that failed) and the first such
        failure."""
        topo = self.topology
        await topo.ensure(self._timeout)
        groups: dict[Addr, list[int]] = {}
        if not topo.cluster:
            groups[topo.seed] = todo
        else:
            for i in todo:
                addr = asking.get(i) or topo.node_of(key_of(commands[i]))
                groups.setdefault(addr, []).append(i)
        results = await asyncio.gather(
            *(
                self._send(addr, idx, commands, asking, replicated and topo.replicas_of(addr))
                for addr, idx in groups.items()
            ),
            return_exceptions=True,
        )
        again: list[int] = []
        failure: BaseException | None = None
        asking.clear()
        for idx, res in zip(groups.values(), results, strict=True):
            if isinstance(res, BaseException):
                failure = failure or res
                again += idx
                continue
            for i, reply in zip(idx, res, strict=True):
                moved = redirect(reply) if topo.cluster else None
                if moved is None:
                    replies[i] = reply
                    continue
                again.append(i)
                if moved[0] == "ASK":
                    asking[i] = moved[1]
                else:
                    topo.invalidate()
        if failure is not None and not isinstance(failure, _LOST):
            raise failure
        return sorted(again), failure

    async def _send(
        self,
        addr: Addr,
        idx: list[int],
        commands: Sequence[Sequence[bytes]],
        asking: dict[int, Addr],
        replicas: int,
    ) -> list[Any]:
        """``commands[idx]`` on ``addr``'s connection; then, if it has ``replicas``, a WAIT
        for one of them (its reply is not returned)."""
        node = self._nodes.get(addr)
        if node is None:
            node = self._nodes[addr] = _Node(addr)
        try:
            if node.writer is None:
                node.reader, node.writer = await connect(
                    self._access, name=self.name, timeout_s=self._timeout, addr=addr
                )
                node.parser = RespParser()
            packed: list[bytes] = []
            for i in idx:
                if i in asking:
                    packed.append(command(b"ASKING"))
                packed.append(command(*commands[i]))
            if replicas:
                packed.append(command(b"WAIT", b"1", b"%d" % REPLICA_WAIT_MS))
            out = await node.run(packed)
        except BaseException:
            node.close()
            raise
        if replicas and not (isinstance(acked := out.pop(), int) and acked >= 1):
            self.topology.invalidate()  # its replica is lagging or gone: count them again
        if len(out) == len(idx):
            return out
        # Drop ASKING's replies.
        it = iter(out)
        kept = []
        for i in idx:
            if i in asking:
                next(it)
            kept.append(next(it))
        return kept

    async def aclose(self) -> None:
        async with self._lock:
            for node in self._nodes.values():
                node.close()
            self._nodes.clear()
