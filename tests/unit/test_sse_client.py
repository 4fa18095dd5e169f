"""The benchmarks' SSE clients against a real local HTTP server."""

from __future__ import annotations

import asyncio

import pytest

from services.bench.sse_client import EventStream, HttpError, SsePool


async def _serve(
    status: int = 200, close_after_s: float | None = None
) -> tuple[asyncio.Server, list[int]]:
    """A keep-alive HTTP/1.1 server that answers every POST with two SSE events (or an
    error body), and closes each connection ``close_after_s`` after an answer, as a server's
    keep-alive timeout does. Returns the server and a list that counts its connections."""
    conns: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = await reader.readexactly(length)
                if status == 200:
                    payload = b"data: " + body + b"\n\ndata: [DONE]\n\n"
                    ctype = b"text/event-stream"
                else:
                    payload, ctype = b'{"error": "nope"}', b"application/json"
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                    % (status, ctype, len(payload))
                    + payload
                )
                await writer.drain()
                if close_after_s is not None:
                    await asyncio.sleep(close_after_s)
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, conns


def _port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


async def _post(pool: SsePool, body: bytes) -> list[bytes]:
    got: list[bytes] = []
    await pool.post("/x", body, lambda data, _t: got.append(data))
    return got


async def test_payloads_arrive_in_order_over_one_kept_alive_connection() -> None:
    server, conns = await _serve()
    async with server, SsePool("127.0.0.1", _port(server), timeout=5) as pool:
        for body in (b'{"n": 1}', b'{"n": 2}'):
            assert await _post(pool, body) == [body, b"[DONE]"]
    assert len(conns) == 1


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    server, conns = await _serve(close_after_s=0.05)
    async with server, SsePool("127.0.0.1", _port(server), timeout=5) as pool:
        for body in (b'{"n": 1}', b'{"n": 2}'):
            assert await _post(pool, body) == [body, b"[DONE]"]
            await asyncio.sleep(0.3)  # past the server's keep-alive
    assert len(conns) == 2


async def test_an_error_status_raises_with_the_body() -> None:
    server, _ = await _serve(status=429)
    async with server, SsePool("127.0.0.1", _port(server), timeout=5) as pool:
        with pytest.raises(HttpError) as err:
            await pool.post("/x", b"{}", lambda data, _t: None)
    assert err.value.status == 429
    assert "nope" in str(err.value)


async def _serve_stream(status: int, events: int) -> tuple[asyncio.Server, list[bytes]]:
    """A server that answers a GET with its headers at once, then ``events`` SSE events
    (in pieces split mid-event) and ``[DONE]``. Returns it and the request heads it got."""
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: text/event-stream\r\n\r\n" % status)
        await writer.drain()
        if status == 200:
            body = b"".join(b'id: %d\ndata: {"text":"%d"}\n\n' % (i, i) for i in range(events))
            for cut in range(0, len(body), 7):
                writer.write(body[cut : cut + 7])
                await writer.drain()
            writer.write(b"data: [DONE]\n\n")
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), heads


async def test_an_event_stream_counts_whole_events_and_hands_them_over() -> None:
    server, heads = await _serve_stream(200, events=50)
    frames: list[bytes] = []
    async with server:
        stream = EventStream(
            "127.0.0.1", _port(server), "/v1/requests/r1/stream", lambda f, _t: frames.append(f)
        )
        await stream.open()
        await asyncio.wait_for(stream.read(), 5)
    assert heads[0].startswith(b"GET /v1/requests/r1/stream HTTP/1.1\r\n")
    assert stream.events == 50
    assert all(f.endswith(b"\n\n") for f in frames)  # never half an event
    assert b"".join(frames).count(b"id: ") == 50
    assert 0 < stream.first_at <= stream.last_at


async def test_an_event_stream_refused_raises() -> None:
    server, _ = await _serve_stream(404, events=0)
    async with server:
        with pytest.raises(RuntimeError, match="stream refused"):
            await EventStream("127.0.0.1", _port(server), "/x").open()
