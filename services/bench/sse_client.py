"""The benchmarks' SSE clients, both cheap per event because they share the machine's
cores with the stack they measure, so whatever they spend per streamed chunk is taken from
the services:

- :class:`SsePool` (the load generator's): keep-alive HTTP/1.1 connections that post a
  JSON body and hand each server-sent ``data:`` payload to a callback the moment its bytes
  arrive. Why not httpx: with httpx (h11, anyio and a timeout per read) the client was the
  largest CPU user beside the engine. Here each chunk costs one ``data_received`` call,
  parsed by httptools (the C parser uvicorn uses, already a dependency), with no task
  switch.
- :class:`EventStream` (the edge benchmark's): one ``GET`` event stream read straight off
  the socket, its events counted per read in bulk rather than one by one, for a relay's
  events/s at rates where even a per-event callback would cost more than the relay.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from time import perf_counter

import httptools

OnData = Callable[[bytes, float], None]  # (payload, perf_counter when its bytes arrived)
OnFrames = Callable[[bytes, int], None]  # (whole events, time.monotonic_ns when they arrived)


class HttpError(RuntimeError):
    """A streamed request the server refused: its status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode(errors='replace')}")
        self.status = status


class _Connection(asyncio.Protocol):
    """One connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.open = False
        self._parser: httptools.HttpResponseParser | None = None
        self._done: asyncio.Future[None] | None = None
        self._on_data: OnData | None = None
        self._status = 0
        self._keep_alive = False
        self._line = b""
        self._error_body: list[bytes] = []
        self._now = 0.0

    # --- asyncio.Protocol -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.open = True

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            return  # nothing was asked: a server's stray bytes
        self._now = perf_counter()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(ConnectionError(f"bad HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._finish(ConnectionError(f"connection closed mid-response ({exc})"))

    # --- httptools callbacks ----------------------------------------------------------
    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self._status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self._status != 200:
            self._error_body.append(body)
            return
        assert self._on_data is not None
        # Lines of an event stream; only ``data:`` lines carry payloads.
        lines = (self._line + body).split(b"\n")
        self._line = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                self._on_data(line[5:].strip(), self._now)

    def on_message_complete(self) -> None:
        if self._status != 200:
            self._finish(HttpError(self._status, b"".join(self._error_body)))
        else:
            self._finish(None)
        if not self._keep_alive:
            self.close()

    # --- use --------------------------------------------------------------------------
    async def post(self, host: str, path: str, headers: bytes, body: bytes, on: OnData) -> None:
        assert self.transport is not None and self._done is None
        self._parser = httptools.HttpResponseParser(self)
        self._done = asyncio.get_running_loop().create_future()
        self._on_data, self._status, self._line, self._error_body = on, 0, b"", []
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n"
        ).encode()
        self.transport.write(head + headers + b"\r\n" + body)
        try:
            await self._done
        finally:
            self._done = self._parser = self._on_data = None

    def _finish(self, exc: BaseException | None) -> None:
        done = self._done
        if done is None or done.done():
            return
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()


class SsePool:
    """Keep-alive connections to one server, opened as needed and reused."""

    def __init__(
        self, host: str, port: int, headers: dict[str, str] | None = None, timeout: float = 300
    ) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        self._idle: list[_Connection] = []

    async def post(self, path: str, body: bytes, on_data: OnData) -> None:
        """Post ``body`` to ``path``; ``on_data`` gets each ``data:`` payload of the
        response. Raises ``HttpError`` for a status other than 200."""
        conn = self._take_idle() or await self._connect()
        try:
            await asyncio.wait_for(
                conn.post(f"{self.host}:{self.port}", path, self._headers, body, on_data),
                self.timeout,
            )
        except BaseException:
            conn.close()
            raise
        if conn.open:
            self._idle.append(conn)

    def _take_idle(self) -> _Connection | None:
        """An idle connection still open; those the server closed meanwhile (its keep-alive
        timeout) are dropped: a request written to one would wait for an answer forever."""
        while self._idle:
            conn = self._idle.pop()
            if conn.open:
                return conn
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        return conn

    async def __aenter__(self) -> SsePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


class EventStream:
    """One server-sent event stream (``GET path``) read off the socket with no HTTP library
    in the way. :meth:`open` returns once the response's headers are in (for a resume
    stream: once the server has subscribed); :meth:`read` then counts events (``id:``
    lines) until ``data: [DONE]`` or the connection closes, and hands ``on_frames`` each
    run of whole events with the ``time.monotonic_ns`` their bytes arrived."""

    def __init__(self, host: str, port: int, path: str, on_frames: OnFrames | None = None) -> None:
        self.host, self.port, self.path = host, port, path
        self.on_frames = on_frames
        self.events = 0
        self.first_at = self.last_at = 0.0  # time.monotonic of the first and last events

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"stream refused: {head[:200]!r}")

    async def read(self) -> None:
        buf = b""
        while True:
            data = await self.reader.read(262_144)
            now = time.monotonic_ns()
            if not data:
                break
            buf += data
            cut = buf.rfind(b"\n\n")
            if cut < 0:
                continue
            frames, buf = buf[: cut + 2], buf[cut + 2 :]
            n = frames.count(b"id: ")
            if n and not self.events:
                self.first_at = now / 1e9
            self.events += n
            self.last_at = now / 1e9
            if self.on_frames is not None:
                self.on_frames(frames, now)
            if b"data: [DONE]" in frames:
                break
        self.writer.close()
