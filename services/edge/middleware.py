"""ASGI middleware: a body-size limit (413) and per-route request counts."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.edge.metrics import EdgeMetrics

# Oversized bodies up to this size are read and dropped before the 413 goes out; larger
# ones are refused at once and the connection closed.
DRAIN_LIMIT = 16 * 1024 * 1024


class BodyLimit:
    """Refuses request bodies over ``max_bytes`` with 413, before any parsing: by the
    declared ``Content-Length`` at once, or while reading a chunked body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > DRAIN_LIMIT:
            await self._refuse(send, drained=False)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                more = bool(msg.get("more_body", False))
                await self._refuse(send, drained=await _drain(receive, size, more))
                return
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, *, drained: bool) -> None:
        err = {
            "message": f"request body larger than {self.max_bytes} bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
        data = orjson.dumps({"error": err})
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
        if not drained:  # the rest of the body is still coming: do not read it
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": data})


async def _drain(receive: Receive, size: int, more: bool) -> bool:
    """Read and drop the rest of an oversized body (up to ``DRAIN_LIMIT``), so the client
    sees the 413 rather than a connection reset while it is still sending."""
    while more and size <= DRAIN_LIMIT:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return False
        size += len(msg.get("body", b""))
        more = msg.get("more_body", False)
    return not more


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class CountRequests:
    """``tw_edge_requests{route, status}``, keyed by route template (never the raw path,
    which would make one series per request id)."""

    def __init__(self, app: ASGIApp, metrics: EdgeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def capture(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, capture)
        finally:
            route: Any = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(path, str(status)).inc()
