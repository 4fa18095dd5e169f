"""Redis's wire protocol (RESP2) for the hot paths that bypass redis-py: the edge's pub/sub
hub, and the worker's token-event writes and per-request claims.

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

from shared.redis_client import RedisAccess, as_access


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
    redis: str | RedisAccess, *, name: str, timeout_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to Redis (a URL, or access with an ACL user and TLS), authenticated,
    named (for ``CLIENT LIST``) and on the URL's database. Raises ``OSError``,
    ``TimeoutError`` or ``RedisReplyError``."""
    access = as_access(redis)
    u = parse_url(access.url)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            u.get("host", "127.0.0.1"), u.get("port", 6379), ssl=access.ssl_context()
        ),
        timeout_s,
    )
    hello = []
    user, password = access.login()
    if password:
        auth = [user.encode()] if user else []
        hello.append(command(b"AUTH", *auth, password.encode()))
    # A connection name may not hold spaces or control characters.
    hello.append(command(b"CLIENT", b"SETNAME", re.sub(r"[^!-~]", "_", name).encode()))
    if u.get("db"):
        hello.append(command(b"SELECT", str(u["db"]).encode()))
    for cmd in hello:
        writer.write(cmd)
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        if not line.startswith(b"+"):
            writer.close()
            raise RedisReplyError(line.decode(errors="replace").strip())
    return reader, writer


class RespWriter:
    """A connection of its own for pipelined writes on a hot path: the commands go out in
    one write and their replies are read back together.

    Batches are sent one at a time. A lost connection is opened again and the whole batch
    sent again (up to ``attempts`` times, then ``ConnectionError``), so callers may only
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
        self._url = redis
        self.name = name
        self._timeout = timeout_s
        self._attempts = attempts
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser = RespParser()
        self.reconnects = 0

    async def execute(self, commands: Sequence[bytes]) -> list[Any]:
        """Send packed ``commands``; their replies in order (errors as ``RedisReplyError``
        values)."""
        if not commands:
            return []
        async with self._lock:
            for attempt in range(self._attempts):
                try:
                    async with asyncio.timeout(self._timeout):
                        if self._writer is None:
                            await self._open()
                        assert self._writer is not None
                        self._writer.write(b"".join(commands))
                        return await self._replies(len(commands))
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                    self._close()
                    if attempt == self._attempts - 1:
                        raise ConnectionError(f"redis: {exc!r}") from exc
                    self.reconnects += 1
                    await asyncio.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    async def _open(self) -> None:
        self._reader, self._writer = await connect(
            self._url, name=self.name, timeout_s=self._timeout
        )
        self._parser = RespParser()

    async def _replies(self, n: int) -> list[Any]:
        assert self._reader is not None
        out: list[Any] = []
        while len(out) < n:
            data = await self._reader.read(262_144)
            if not data:
                raise ConnectionResetError("connection closed by Redis")
            out += self._parser.feed(data)
        return out

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def aclose(self) -> None:
        async with self._lock:
            self._close()
